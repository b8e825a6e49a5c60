"""The :class:`~lr_client.store.contract.CascadeReports` role: the control plane's rows.

A child reports itself to its provider (the ``Cascade`` call): the provider
records the report in ``lrq_cascade_children``; the reply's global watermark
is stored in ``lrq_cascade.global_watermark``; ``lr provider switch`` moves a
node to another provider (``lrq_cascade.provider_id``, ``epoch`` + 1).
"""

from __future__ import annotations

import time

from sqlalchemy import case, select, update

from lr_client.cascade_roles import CascadeRole
from lr_client.errors import InvalidInputError
from lr_client.names import validate_name
from lr_client.store.role import Role
from lr_client.store.schema import tables as s

_C, _K = s.cascade, s.cascade_children


def _position(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{what} must be a non-negative integer, not {value!r}")
    return value


class CascadeReportsStore(Role):
    """Children's reports, the global watermark and provider switches."""

    def record_cascade_report(
        self,
        client_name: str,
        child_id: str,
        epoch: int,
        local_watermark: int,
        acked_position: int,
        reported_at: float | None = None,
    ) -> bool:
        validate_name(client_name, "client name")
        validate_name(child_id, "site id")
        _position(epoch, "epoch")
        _position(local_watermark, "local watermark")
        _position(acked_position, "acked position")
        now = time.time() if reported_at is None else reported_at
        # One statement: two reports of a new child at once (``lr provider switch``'s and
        # the server's periodic one) must not both find no row and both insert it.
        stmt = self.core.dialect_insert(_K).values(
            client_name=client_name,
            child_id=child_id,
            epoch=epoch,
            local_watermark=local_watermark,
            acked_position=acked_position,
            reported_at=now,
            dropped=False,
        )
        new = stmt.excluded
        stmt = stmt.on_conflict_do_update(
            index_elements=[_K.c.client_name, _K.c.child_id],
            set_={
                "epoch": new.epoch,
                "local_watermark": new.local_watermark,
                "acked_position": new.acked_position,
                "reported_at": new.reported_at,
                # A newer epoch adopts the node; the same one keeps a drop.
                "dropped": case((new.epoch > _K.c.epoch, False), else_=_K.c.dropped),
            },
            where=new.epoch >= _K.c.epoch,  # an older epoch is refused
        ).returning(_K.c.epoch)
        with self.core.write() as conn:
            return conn.execute(stmt).first() is not None

    def set_global_watermark(self, client_name: str, value: int) -> bool:
        _position(value, "global watermark")
        with self.core.write() as conn:
            done = conn.execute(
                update(_C)
                .where(_C.c.client_name == client_name)
                .values(global_watermark=value, updated_at=time.time())
            )
        return bool(done.rowcount)

    def switch_cascade_provider(self, client_name: str, provider_id: str) -> int | None:
        validate_name(provider_id, "site id")
        with self.core.write() as conn:
            row = conn.execute(
                select(_C.c.role, _C.c.epoch, _C.c.origin_id)
                .where(_C.c.client_name == client_name)
                .with_for_update()
            ).first()
            if row is None:
                return None
            if row.role == CascadeRole.ROOT:
                raise InvalidInputError(f"{client_name}: the root of a set has no provider")
            epoch = int(row.epoch) + 1
            conn.execute(
                update(_C)
                .where(_C.c.client_name == client_name)
                .values(provider_id=provider_id, epoch=epoch, updated_at=time.time())
            )
        return epoch


__all__ = ["CascadeReportsStore"]
