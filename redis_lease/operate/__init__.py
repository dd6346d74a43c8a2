"""What operators see; reads only, and nothing below imports it: views of runs, items and
workers (:mod:`.views`, :mod:`.run_views`, :mod:`.worker_views`), the command line's
printing (:mod:`.cli_printing`), the metrics exporter (:mod:`.metrics`) and the dashboard
(:mod:`.dashboard`)."""
