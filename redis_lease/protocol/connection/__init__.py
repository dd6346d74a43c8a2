"""Reaching Redis: clients from URLs (:mod:`.clients`), Cluster (:mod:`.cluster`), TLS
(:mod:`.tls`), URLs (:mod:`.urls`), the store's wait for replicas (:mod:`.replica_wait`),
the server's settings checked at start (:mod:`.server_checks`), and the one translation of
what Redis raises into this library's errors (:mod:`.translate`)."""
