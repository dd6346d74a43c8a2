"""Loss, in one place: the data set's mark that tells a tick its Redis lost what it wrote
(:mod:`.data_set_mark`), what the tick remembers of it outside that Redis
(:mod:`.tick_memory`), the records of lost runs (:mod:`.lost_records`), and lost runs made
again or named (:mod:`.lost_runs`)."""
