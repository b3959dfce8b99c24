"""The proxy an HTTP(S) request goes through: the one the environment names, as curl, urllib and
boto3 take it.

``http_proxy`` / ``https_proxy`` (or their upper-case names; the lower-case one first, an empty
one too, as urllib reads them), else ``all_proxy``, name a proxy for each scheme, and ``no_proxy``
the hosts reached directly (``127.0.0.1,.internal``, ``10.0.0.0/8``, ``*`` for all). urllib3 reads
none of these: a cluster that reaches its data through a proxy could not stream it, and the error
blamed the name's resolution. A SOCKS proxy (``socks5h://``) needs PySocks.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import urllib.request
from urllib.parse import unquote, urlsplit

import urllib3

from .errors import SourceError, redact
from .per_process import per_process

#: One pool a proxy, per process (a pool inherited through fork would share sockets).
_proxied = per_process(dict)


def _setting(name: str) -> str:
    """The variable ``name``, lower-case first (set empty, it stands: no proxy), else upper-case."""
    value = os.environ.get(name)
    return os.environ.get(name.upper(), "") if value is None else value


def proxy_for(url: str) -> str | None:
    """The proxy the environment sends ``url`` through, or ``None`` (directly). Read at each
    request, which costs a few lookups where no proxy is set."""
    scheme = url.partition("://")[0].lower()
    proxy = _setting(f"{scheme}_proxy") or _setting("all_proxy")
    if not proxy:
        return None
    host = urlsplit(url).hostname or ""
    bypass = _setting("no_proxy")
    return None if bypass and _bypassed(host, bypass) else proxy


def _bypassed(host: str, bypass: str) -> bool:
    """Whether ``no_proxy``'s ``bypass`` takes ``host``: its names and domains, as urllib reads
    them, and its networks (``10.0.0.0/8``), as curl does, for an address."""
    if urllib.request.proxy_bypass_environment(host, {"no": bypass}):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    for entry in bypass.split(","):
        try:
            if address in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:  # a name, not a network
            continue
    return False


def pool_for(url: str, direct: urllib3.PoolManager) -> urllib3.PoolManager:
    """The pool that sends a request for ``url``: ``direct``, or one through its proxy (whose
    user and password, where its URL holds them, go as proxy authentication)."""
    proxy = proxy_for(url)
    if proxy is None:
        return direct
    pools = _proxied()
    if proxy not in pools:
        pools[proxy] = _proxy_pool(url, proxy)
    return pools[proxy]


def _proxy_pool(url: str, proxy: str) -> urllib3.PoolManager:
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme.startswith("socks"):
        if importlib.util.find_spec("socks") is None:
            raise SourceError(url, None, f"the environment's proxy {redact(proxy)} is a SOCKS proxy, which needs "
                                         f"PySocks: pip install pysocks")
        from urllib3.contrib.socks import SOCKSProxyManager

        return SOCKSProxyManager(proxy, num_pools=16, maxsize=8)
    headers = None
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers = urllib3.util.make_headers(proxy_basic_auth=user)
    address = f"{parts.scheme}://{parts.hostname}{'' if parts.port is None else f':{parts.port}'}"
    return urllib3.ProxyManager(address, num_pools=16, maxsize=8, proxy_headers=headers)
