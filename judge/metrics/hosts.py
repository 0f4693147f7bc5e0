"""A passage url's host and site, for ``sites@k``, ``authority@k`` and ``low_quality@k``.

Host: the url's host name (:func:`urllib.parse.urlsplit`; a url without a scheme such as
``example.com/page`` is read as ``//example.com/page``), normalised by
:func:`judge.tiers.normalise_host` (NFKC, case-folded, punycode decoded). None for no url, an
empty one, or one without a host (``mailto:``, ``file:///``).

Site: the host's registrable domain by the Public Suffix List. ``news.bbc.co.uk`` and
``www.bbc.co.uk`` are one site, ``bbc.co.uk``; under a suffix the list's private section names,
each registrant is its own site (``alice.github.io`` and ``bob.github.io`` differ, as do two
blogspot blogs). A leading ``www.`` is dropped first, so ``www.gov.cn`` is ``gov.cn``. A host
that is itself a public suffix, an IP address or one label (``localhost``) is its own site.

The list comes from the ``publicsuffixlist`` package, which ships it inside its wheel (its
version carries the list's date) and has no fetching code on its import path: nothing is
downloaded, ever. ``tldextract`` was not chosen because it fetches the list over HTTP on first
use unless configured not to: one missed setting from a network call in a nightly job.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from urllib.parse import urlsplit

from publicsuffixlist import PublicSuffixList

from judge.tiers import normalise_host

__all__ = ["host_of", "site_of"]


@functools.cache
def _suffixes() -> PublicSuffixList:
    """Parsed once, on first use (about 70 ms)."""
    return PublicSuffixList(only_icann=False)


# A scheme with no "//" authority after it: "javascript:alert(1)", "data:...", "tel:+1...".
# A host's port ("example.com:8080") is digits, not a scheme's body.
_NO_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:(?!//)(?!\d)")


@functools.lru_cache(maxsize=1 << 16)  # the same urls recur across engines and repeats
def host_of(url: str | None) -> str | None:
    """The normalised host of ``url``, or None when it has none."""
    if not url or not url.strip():
        return None
    url = url.strip()
    if _NO_AUTHORITY.match(url):  # javascript:, data:, tel:, mailto: ... name no website
        return None
    if "://" not in url and not url.startswith("//"):
        url = "//" + url
    try:
        host = urlsplit(url).hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None
    return normalise_host(host) if host else None


def site_of(url: str | None) -> str | None:
    """The registrable domain of ``url``'s host (see the module doc), or None without a host."""
    host = host_of(url)
    return None if host is None else _site(host)


@functools.lru_cache(maxsize=1 << 16)
def _site(host: str) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if host.startswith("www.") and "." in host[4:]:
        host = host[4:]
    return _suffixes().privatesuffix(host) or host
