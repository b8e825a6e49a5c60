"""Build site config files and running sites for tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_server import Site
from lr_server.server import SiteServer
from tests.kit.certs import Pki
from tests.kit.ports import reserve_port
from tests.kit.wait import scaled, wait_for

__all__ = [
    "CHAIN",
    "SEED_TREE",
    "CascadeTree",
    "SiteSpec",
    "Sites",
    "free_port",
    "wait_for",
    "write_config",
]


def free_port() -> int:
    """A loopback port reserved for this test process's servers (see ``tests.kit.ports``)."""
    return reserve_port()


@dataclass
class SiteSpec:
    id: str
    db_url: str
    port: int = 0
    destinations: Sequence[tuple[str, int]] = ()  # (site id, port)
    sources: Sequence[str] = ()
    source_ports: dict[str, int] = field(default_factory=dict)  # a source's port: its address
    clients: Sequence[str] = ("policy",)
    snapshot: str = "none"
    metrics_port: int = 0
    replication: str = ""  # extra lines of the [replication] section
    client_options: str = ""  # extra lines of each [[clients]] table
    dest_options: str = ""  # extra lines of each [[destinations]] table
    extra: str = ""


@dataclass(frozen=True)
class CascadeTree:
    """A cascaded client's set for tests: ``nodes`` maps each non-root node to its provider;
    ``branches`` names nodes that are branches with nothing below them (``branches`` of
    ``[cascade.<client>]``); ``spares`` maps a node to the nodes it may be switched to
    (``lr provider switch``): their configurations list each other up front."""

    root: str
    nodes: dict[str, str]
    branches: tuple[str, ...] = ()
    spares: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def members(self) -> list[str]:
        """The root, then every other node (a provider before the nodes below it)."""
        out = [self.root]
        while len(out) <= len(self.nodes):
            out += sorted(n for n, p in self.nodes.items() if p in out and n not in out)
        return out

    def provider(self, node: str) -> str:
        return self.nodes.get(node, "")

    def children(self, node: str) -> list[str]:
        return sorted(n for n, p in self.nodes.items() if p == node)

    def with_spares(self, **spares: tuple[str, ...]) -> CascadeTree:
        """This set, with ``node=(provider, ...)``: the nodes ``node`` may be switched to."""
        return CascadeTree(self.root, self.nodes, self.branches, {**self.spares, **spares})

    def table(self, client: str) -> str:
        """The ``[cascade.<client>]`` table, the same on every node."""
        nodes = ", ".join(f"{n} = {_q(p)}" for n, p in sorted(self.nodes.items()))
        lines = [f"[cascade.{client}]", f"root = {_q(self.root)}", f"nodes = {{ {nodes} }}"]
        if self.branches:
            lines.append(f"branches = [{', '.join(_q(b) for b in self.branches)}]")
        return "\n".join(lines)

    def node_sections(
        self,
        site: str,
        client: str,
        ports: Mapping[str, int],
        token: Callable[[str], str] | None = None,
        sources: Sequence[str] | None = None,
    ) -> str:
        """The cascade part of ``site``'s configuration: a ``[[destinations]]`` entry per
        node it ships to (its children, and the nodes that may be switched to it), a
        ``[[sources]]`` entry per node it accepts (``sources``, default: its provider, the
        providers it may be switched to, and the nodes it ships to, which report to it),
        with its address where ``ports`` has it (reports go there) and its ``token``,
        then the ``[cascade.<client>]`` table. The one writer of a cascade node's TOML."""
        adopted = sorted(n for n, spare in self.spares.items() if site in spare)
        dests = [*self.children(site), *(n for n in adopted if n not in self.children(site))]
        if sources is None:
            providers = [p for p in (self.provider(site), *self.spares.get(site, ())) if p]
            sources = [*providers, *(d for d in dests if d not in providers)]
        lines: list[str] = []
        for dest in dests:
            address = f"127.0.0.1:{ports[dest]}"
            lines += ["[[destinations]]", f"id = {_q(dest)}", f"address = {_q(address)}"]
        for src in sources:
            lines += ["[[sources]]", f"id = {_q(src)}"]
            if token is not None:
                lines.append(f"token = {_q(token(src))}")
            if src in ports:
                lines.append(f'address = "127.0.0.1:{ports[src]}"')
        return "\n".join([*lines, self.table(client)])


#: The seed's tree: S1 the root; S2 and S3 below it; S4 below S3. S2 is a branch with
#: nothing below it, so that a node can be switched to it (``branches``).
SEED_TREE = CascadeTree("s1", {"s2": "s1", "s3": "s1", "s4": "s3"}, branches=("s2",))
#: A chain of three levels: root -> branch -> leaf.
CHAIN = CascadeTree("c1", {"c2": "c1", "c3": "c2"})


def _q(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(
    directory: Path,
    spec: SiteSpec,
    *,
    security: str = "token",
    pki: Pki | None = None,
    tokens: dict[str, str] | None = None,
) -> Path:
    """Write ``<directory>/<id>.toml``; security is "token" (plaintext), "mtls" or
    "plaintext" (``transport = "plaintext"`` alone: loopback, no client authentication)."""
    tokens = tokens or {}
    lines = ["[site]", f"id = {_q(spec.id)}", f"database_url = {_q(spec.db_url)}"]
    if spec.port:
        lines.append(f'listen = "127.0.0.1:{spec.port}"')
    if spec.metrics_port:
        lines.append(f"metrics_port = {spec.metrics_port}")
    lines.append("[security]")
    if security == "mtls":
        assert pki is not None
        client = pki.client(spec.id)
        lines += [
            'transport = "tls"',
            'client_auth = "mtls"',
            f"ca_file = {_q(str(pki.ca.cert))}",
            f"cert_file = {_q(str(client.cert))}",
            f"key_file = {_q(str(client.key))}",
        ]
    elif security == "plaintext":
        lines.append('transport = "plaintext"')
    else:
        lines += [
            'transport = "plaintext"',
            'client_auth = "token"',
            f"token = {_q(tokens.get(spec.id, 'token-' + spec.id))}",
        ]
    lines += [
        "[replication]",
        "poll_interval = 0.01",
        *([spec.replication] if spec.replication else []),
        "[retry]",
        "initial_backoff = 0.05",
        "max_backoff = 0.5",
    ]
    for name in spec.clients:
        lines += ["[[clients]]", f"name = {_q(name)}", f"snapshot = {_q(spec.snapshot)}"]
        if spec.client_options:
            lines.append(spec.client_options)
    for dest, port in spec.destinations:
        lines += ["[[destinations]]", f"id = {_q(dest)}", f'address = "127.0.0.1:{port}"']
        if spec.dest_options:
            lines.append(spec.dest_options)
        if security == "mtls":
            lines.append(f"server_name = {_q(dest)}")
    for src in spec.sources:
        lines += ["[[sources]]", f"id = {_q(src)}"]
        if src in spec.source_ports:  # a cascade node reports to its provider there
            lines.append(f'address = "127.0.0.1:{spec.source_ports[src]}"')
            if security == "mtls":
                lines.append(f"server_name = {_q(src)}")
        if security == "token":
            lines.append(f"token = {_q(tokens.get(src, 'token-' + src))}")
    if spec.extra:
        lines.append(spec.extra)
    path = directory / f"{spec.id}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Sites:
    """Start and stop in-process sites; everything is stopped at the end."""

    def __init__(self, tmp_path: Path, make_url: Callable[[str], str]) -> None:
        self.tmp_path = tmp_path
        self.make_url = make_url
        self.urls: dict[str, str] = {}
        self.ports: dict[str, int] = {}
        self.running: dict[str, Site] = {}
        self.stores: list[SQLAlchemyQueueStore] = []
        #: Seconds a stopped site's receiver leaves the calls open to it before it cancels
        #: them (``Site.stop(call_grace=...)``); ``None``: the server's default. A sender's
        #: stream never ends by itself, so a site that others ship to takes that long
        #: to stop: set it where how the receiver's calls end is not what is tested.
        self.call_grace: float | None = None

    def port(self, site: str) -> int:
        return self.ports.setdefault(site, free_port())

    def url(self, site: str) -> str:
        """The database of ``site``, made on first use."""
        if site not in self.urls:
            self.urls[site] = self.make_url(site)
        return self.urls[site]

    def start(
        self,
        site: str,
        dests: Sequence[str] = (),
        sources: Sequence[str] = (),
        **kw: object,
    ) -> SiteServer:
        spec = SiteSpec(
            site,
            self.url(site),
            port=self.port(site) if sources else 0,
            destinations=[(d, self.port(d)) for d in dests],
            sources=list(sources),
            **kw,  # type: ignore[arg-type]
        )
        running = Site(write_config(self.tmp_path, spec))
        running.start()
        self.running[site] = running
        running.wait_serving(scaled(30))
        return running.server

    def node_config(
        self, tree: CascadeTree, site: str, client: str = "policy", **kw: object
    ) -> Path:
        """Write the config of one node of a cascaded ``client``: its cascade sections
        (:meth:`CascadeTree.node_sections`, token security: ``token-<site>``) and ``kw``
        (:class:`SiteSpec` fields; ``extra`` goes after the cascade sections)."""
        extra = str(kw.pop("extra", ""))
        ports = {n: self.port(n) for n in tree.members()}
        cascade = tree.node_sections(site, client, ports, token=lambda s: "token-" + s)
        spec = SiteSpec(
            site,
            self.url(site),
            port=self.port(site),
            clients=(client,),
            extra="\n".join(x for x in (cascade, extra) if x),
            **kw,  # type: ignore[arg-type]
        )
        return write_config(self.tmp_path, spec)

    def start_node(
        self, tree: CascadeTree, site: str, client: str = "policy", **kw: object
    ) -> SiteServer:
        """Start one node of a cascaded ``client`` in this process (see :meth:`node_config`)."""
        running = Site(self.node_config(tree, site, client, **kw))
        running.start()
        self.running[site] = running
        running.wait_serving(scaled(30))
        return running.server

    def stop(self, site: str) -> None:
        running = self.running.pop(site)
        if self.call_grace is None:
            running.stop()
        else:
            running.stop(call_grace=self.call_grace)

    def store(self, site: str) -> SQLAlchemyQueueStore:
        st = open_store(self.url(site))
        st.create_schema()
        st.retention.rotation_period = (
            0.0  # PostgreSQL: a trim closes the current slot, as ``lr trim``
        )
        self.stores.append(st)
        return st

    def close(self) -> None:
        """Stop every running site, all at once (each stop waits for its own threads)."""
        sites = list(self.running)
        if sites:
            with ThreadPoolExecutor(len(sites), thread_name_prefix="lr-test-stop") as pool:
                for done in [pool.submit(self.stop, site) for site in sites]:
                    done.result()
        for st in self.stores:
            st.engine.dispose()
