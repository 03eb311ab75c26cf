"""Test access to the real redis-server helper (services.redis_server)."""

from services.redis_server import RedisServer, free_port, have_redis_server, redis_server

__all__ = ["RedisServer", "free_port", "have_redis_server", "redis_server"]
