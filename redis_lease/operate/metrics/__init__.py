"""The Prometheus exporter: the collector (:mod:`.collector`), the attempt histograms
(:mod:`.history`) and the per-job counters (:mod:`.per_job`)."""

from ...extras import require

require("metrics", "the metrics exporter")  # one line naming the extra
