"""``[cascade.<client>]`` tables: roles, providers, children, and every bad key named."""

from __future__ import annotations

from typing import Any

import pytest

from lr_client.errors import ConfigError
from lr_server.config import CascadeConfig, CascadeRole, parse_config

#: The seed's tree: S1 root; S2, S3 below S1; S4 below S3.
NODES = {"s2": "s1", "s3": "s1", "s4": "s3"}


def _raw(site: str, nodes: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    nodes = dict(NODES if nodes is None else nodes)
    cfg = CascadeConfig("orders", "s1", nodes)
    members = cfg.members()
    provider = cfg.provider_of(site) if site in members else ""
    children = cfg.children_of(site) if site in members else []
    table: dict[str, Any] = {"root": "s1", "nodes": nodes}
    table.update(extra)
    return {
        "site": {"id": site, "database_url": "sqlite:///x.db", "listen": "127.0.0.1:7001"},
        "security": {"transport": "plaintext"},
        "clients": [{"name": "orders"}],
        "destinations": [{"id": c, "address": "127.0.0.1:7100"} for c in children],
        "sources": [{"id": provider}] if provider else [],
        "cascade": {"orders": table},
    }


@pytest.mark.parametrize(
    ("site", "role", "provider", "children"),
    [
        ("s1", CascadeRole.ROOT, "", ["s2", "s3"]),
        ("s2", CascadeRole.LEAF, "s1", []),
        ("s3", CascadeRole.BRANCH, "s1", ["s4"]),
        ("s4", CascadeRole.LEAF, "s3", []),
    ],
)
def test_the_seed_tree_gives_each_node_its_role(
    site: str, role: CascadeRole, provider: str, children: list[str]
) -> None:
    cfg = parse_config(_raw(site)).cascade("orders")
    assert cfg is not None
    assert cfg.role_of(site) is role
    assert cfg.provider_of(site) == provider
    assert cfg.children_of(site) == children
    assert cfg.members() == ["s1", "s2", "s3", "s4"]


def test_a_node_named_in_branches_is_a_branch_without_children() -> None:
    """The seed's S2: a branch (a full copy, to serve as a provider) with nothing below."""
    cfg = parse_config(_raw("s2", branches=["s2"])).cascade("orders")
    assert cfg is not None
    assert cfg.role_of("s2") is CascadeRole.BRANCH
    assert cfg.children_of("s2") == []
    assert cfg.role_of("s4") is CascadeRole.LEAF  # the others keep their derived roles
    assert cfg.role_of("s3") is CascadeRole.BRANCH
    with_children = CascadeConfig("orders", "s1", NODES, frozenset({"s3"}))
    assert with_children.role_of("s3") is CascadeRole.BRANCH  # it has children anyway


def test_a_client_without_a_cascade_table_is_not_cascaded() -> None:
    raw = _raw("s2")
    del raw["cascade"]
    assert parse_config(raw).cascade("orders") is None


def test_role_of_a_node_outside_the_set_raises_key_error() -> None:
    with pytest.raises(KeyError):
        CascadeConfig("orders", "s1", NODES).role_of("s9")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r["cascade"].update(billing={"root": "s1"}),
            "cascade.billing: 'billing' is not",
        ),
        (lambda r: r["cascade"]["orders"].update(depth=2), "cascade.orders.depth: unknown key"),
        (lambda r: r["cascade"]["orders"].update(root="S 1"), "cascade.orders.root"),
        (lambda r: r["cascade"]["orders"].pop("root"), "cascade.orders.root"),
        (lambda r: r["cascade"]["orders"].update(nodes=[]), "cascade.orders.nodes: expected a"),
        (
            lambda r: r["cascade"]["orders"]["nodes"].update(s1="s2"),
            "cascade.orders.nodes.s1: the root 's1' has no provider",
        ),
        (
            lambda r: r["cascade"]["orders"]["nodes"].update(s4="s9"),
            "cascade.orders.nodes.s4: provider 's9' is neither the root nor a node",
        ),
        (
            lambda r: r["cascade"]["orders"]["nodes"].update(s5="s6", s6="s5"),
            "cascade.orders.nodes.s5: providers form a cycle",
        ),
        (
            lambda r: r["cascade"]["orders"].update(branches="s2"),
            "cascade.orders.branches: expected a list of node names",
        ),
        (
            lambda r: r["cascade"]["orders"].update(branches=["s1"]),
            "cascade.orders.branches: 's1' is the root, not a branch",
        ),
        (
            lambda r: r["cascade"]["orders"].update(branches=["s9"]),
            "cascade.orders.branches: 's9' is not a node of the set (in nodes)",
        ),
        (
            lambda r: r["cascade"]["orders"].update(branches=["S2"]),
            "cascade.orders.branches: invalid",
        ),
        (
            lambda r: r["cascade"]["orders"].update(branches=["s2", "s2"]),
            "cascade.orders.branches: a node is named twice",
        ),
        (
            lambda r: r["site"].update(id="s9"),
            "cascade.orders.nodes: this site 's9' is not a node of the set",
        ),
        (
            lambda r: r.update(destinations=[]),
            "cascade.orders.nodes.s4: this site provides 's4', which is not in [[destinations]]",
        ),
        (
            lambda r: r.update(sources=[]),
            "cascade.orders.nodes.s3: this site's provider 's1' is not in [[sources]]",
        ),
    ],
)
def test_bad_cascade_tables_are_refused_naming_the_key(mutate: Any, message: str) -> None:
    raw = _raw("s3")
    mutate(raw)
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert message in str(exc.value)
