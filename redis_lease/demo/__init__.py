"""The demo: a nightly payment reconciliation run by real RQ workers, with faults injected.

Its command and its embedded backend need the extra ``demo`` (:func:`redis_lease.extras.require`
is called there); the provider and the payments it simulates need nothing more than the core.
"""
