"""The proxy an HTTP(S) request goes through: the one the environment names, as curl, urllib and
boto3 take it.

``http_proxy`` / ``https_proxy`` (or their upper-case names; the lower-case one first, as curl
reads them) name a proxy for each scheme, and ``no_proxy`` the hosts reached directly
(``127.0.0.1,.internal``, ``*`` for all). urllib3 reads none of these: a cluster that reaches its
data through a proxy could not stream it, and the error blamed the name's resolution.
"""

from __future__ import annotations

import os
import urllib.request
from urllib.parse import unquote, urlsplit

import urllib3

from .per_process import per_process

#: One pool a proxy, per process (a pool inherited through fork would share sockets).
_proxied = per_process(dict)


def _setting(name: str) -> str:
    return os.environ.get(name) or os.environ.get(name.upper()) or ""


def proxy_for(url: str) -> str | None:
    """The proxy the environment sends ``url`` through, or ``None`` (directly). Read at each
    request, which costs two lookups where no proxy is set."""
    scheme = url.partition("://")[0].lower()
    proxy = _setting(f"{scheme}_proxy")
    if not proxy:
        return None
    host = urlsplit(url).hostname or ""
    bypass = _setting("no_proxy")
    return None if bypass and urllib.request.proxy_bypass_environment(host, {"no": bypass}) else proxy


def pool_for(url: str, direct: urllib3.PoolManager) -> urllib3.PoolManager:
    """The pool that sends a request for ``url``: ``direct``, or one through its proxy (whose
    user and password, where its URL holds them, go as proxy authentication)."""
    proxy = proxy_for(url)
    if proxy is None:
        return direct
    pools = _proxied()
    if proxy not in pools:
        parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        headers = None
        if parts.username is not None:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers = urllib3.util.make_headers(proxy_basic_auth=user)
        address = f"{parts.scheme}://{parts.hostname}{'' if parts.port is None else f':{parts.port}'}"
        pools[proxy] = urllib3.ProxyManager(address, num_pools=16, maxsize=8, proxy_headers=headers)
    return pools[proxy]
