"""Redis is closed by default: the redis-server the launcher and the tests start has a password, a
client without it gets NOAUTH, the URL reaches the roles through 0600 files and never a log line."""

from __future__ import annotations

import socket
import stat

import pytest
import redis
from redis_fixtures import have_redis_server, redis_server

from stare.config import ConfigError, build_config
from stare.runtime.process import redis_url
from stare.transport.redis_secrets import masked, resolve_url, with_password, write_secret


def needs_redis(test):
    return pytest.mark.redis(pytest.mark.skipif(not have_redis_server(), reason="redis-server is not on PATH")(test))


@needs_redis
def test_a_client_without_the_password_gets_noauth(tmp_path):
    with redis_server(tmp_path / "redis", appendonly=False) as server:
        port = server.port
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:  # what redis-cli does
            raw.sendall(b"SET stare:x:paused 1\r\n")
            assert raw.recv(256).startswith(b"-NOAUTH")
        with pytest.raises(redis.AuthenticationError):  # redis-py (RESP3 HELLO) is refused too
            redis.Redis(host="127.0.0.1", port=port, socket_timeout=5).set("stare:x:paused", "1")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, password="guess", socket_timeout=5).ping()
        assert redis.Redis.from_url(server.url, socket_timeout=5).ping()
        assert server.password not in server.public_url and "***" in server.public_url
        conf = server.dir / "redis.conf"
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600 and server.password in conf.read_text()
        assert server.password not in " ".join(server.proc.args)  # not visible in ps


def test_secret_files_are_written_0600(tmp_path):
    path = write_secret(tmp_path / "dir" / "redis.url", "redis://:pw@h:6379/0")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == "redis://:pw@h:6379/0"


def test_the_url_is_found_in_the_documented_order(tmp_path):
    url_file = write_secret(tmp_path / "url", "redis://:fromfile@r:1/0")
    pw_file = write_secret(tmp_path / "pw", "s3cr/t@")
    env = {"STARE_REDIS_URL_FILE": str(url_file), "STARE_REDIS_URL": "redis://env:2/0"}
    assert resolve_url("redis://default:3/0", url="redis://flag:4/0", environ=env) == "redis://flag:4/0"
    assert resolve_url("redis://default:3/0", environ=env) == "redis://:fromfile@r:1/0"
    assert resolve_url("redis://default:3/0", environ={"STARE_REDIS_URL": "redis://env:2/0"}) == "redis://env:2/0"
    with_pw = resolve_url("redis://default:3/0", environ={"STARE_REDIS_PASSWORD_FILE": str(pw_file)})
    assert with_pw == "redis://:s3cr%2Ft%40@default:3/0"
    assert redis.connection.parse_url(with_pw)["password"] == "s3cr/t@"  # redis-py decodes it back


def test_a_missing_secret_file_names_the_variable():
    cfg = build_config({})
    import os

    old = os.environ.get("STARE_REDIS_URL_FILE")
    os.environ["STARE_REDIS_URL_FILE"] = "/nonexistent/redis.url"
    try:
        with pytest.raises(ConfigError, match="STARE_REDIS_URL_FILE: cannot read /nonexistent/redis.url"):
            redis_url(cfg, None)
    finally:
        os.environ.pop("STARE_REDIS_URL_FILE") if old is None else os.environ.__setitem__("STARE_REDIS_URL_FILE", old)


def test_urls_are_masked_for_logs():
    assert masked("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert masked("redis://learner:pw@h:6379/0") == "redis://learner:***@h:6379/0"
    assert masked("redis://h:6379/0") == "redis://h:6379/0"
    assert with_password("redis://h:6379/0", "p", "learner") == "redis://learner:p@h:6379/0"
