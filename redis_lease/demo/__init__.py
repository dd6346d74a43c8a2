"""The demo: a nightly payment reconciliation run by real RQ workers, with faults injected."""
