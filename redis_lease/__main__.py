"""``python -m redis_lease``: the redis-lease command line."""

from .cli import main

main()
