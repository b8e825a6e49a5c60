"""``lr demo``: replicate between sites on embedded SQLite (the demos are :mod:`lr_server.demo`)."""

from __future__ import annotations

import click


@click.command()
@click.option(
    "--transactions",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Application transactions at the source site.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=1),
    default=20.0,
    show_default=True,
    help="Seconds over which the application spreads them.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary directory (databases, logs).")
@click.option(
    "--topology",
    type=click.Choice(["star", "tree"]),
    default="star",
    show_default=True,
    help="star: a replicates to b, c and d; tree: a cascaded client a -> b -> c, d, "
    "with d moved from b to a mid-run (lr provider switch).",
)
def demo(transactions: int, duration: float, keep: bool, topology: str) -> None:
    """Replicate between sites on embedded SQLite, as real `lr server` processes.

    Needs nothing but this package (Java and PySpark make the late site's
    full sync a Spark job). Ends with a table and a check of every sink;
    exit code 1 if a sink does not hold what it should. With --topology tree,
    the sites form a cascade (docs/cascading.md) and the check covers every node
    and that the provider switch needed no full sync.
    """
    if topology == "tree":
        from lr_server.demo.tree import run_tree_demo

        code = int(run_tree_demo(transactions=transactions, duration=duration, keep=keep))
        if code:
            raise click.exceptions.Exit(code)
        return
    from lr_server.demo.star import run_demo

    code = int(run_demo(transactions=transactions, duration=duration, keep=keep))
    if code:
        raise click.exceptions.Exit(code)
