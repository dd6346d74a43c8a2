"""The demo: a nightly payment reconciliation run by real RQ workers, with faults injected."""

from ..extras import require

require("demo", "the demo")  # its embedded backend; one line naming the extra
