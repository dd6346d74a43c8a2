"""The protocol: Redis and the scripts of ``lua/`` only.

Key names (:mod:`.keys`), the script registry (:mod:`.scripts`), each script's reply
(:mod:`.replies`), a script's error reply as this library's error (:mod:`.error_replies`),
the values the store takes and returns (:mod:`.leases`), checks made before anything
reaches Redis (:mod:`.validation`), guarded writes (:mod:`.guards`), trace ids
(:mod:`.tracing`); clients, and the one place where Redis errors become this library's
errors (:mod:`.connection`); the lease store (:mod:`.store`). It imports nothing above it.
"""
