"""Trigger that watches the spot market from the triggerer until an offer is acceptable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class SpotPriceTrigger(BaseTrigger):
    """
    Poll EC2 spot prices until the cheapest acceptable offer is at or below its limit.

    The AWS calls are the synchronous hook calls of ``SpotPriceSensor.poke``, run in a
    thread (the amazon provider's async hooks need aiobotocore, which is optional).

    :param find_kwargs: keyword arguments of ``airflow_dtrain.aws.prices.find_offer`` (plain values).
    :param poll_interval: seconds between looks at the market.
    """

    def __init__(self, *, find_kwargs: dict[str, Any], poll_interval: float = 60.0) -> None:
        super().__init__()
        self.find_kwargs = find_kwargs
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_dtrain.triggers.spot_price.SpotPriceTrigger",
            {"find_kwargs": self.find_kwargs, "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_dtrain.aws.prices import find_offer

        try:
            while True:
                choice, reasons = await asyncio.to_thread(find_offer, **self.find_kwargs)
                if choice is not None:
                    self.log.info(
                        "Spot offer accepted: %s in %s at $%.4f/h", choice.instance_type,
                        choice.availability_zone, choice.spot_price,
                    )  # fmt: skip
                    yield TriggerEvent(
                        {"status": "success", "choice": choice.to_dict(), "message": "; ".join(reasons)}
                    )
                    return
                self.log.info("No acceptable spot offer yet: %s", "; ".join(reasons))
                await asyncio.sleep(self.poll_interval)
        except Exception as err:  # the task must hear about it, not time out
            self.log.exception("Reading spot prices failed")
            yield TriggerEvent({"status": "error", "message": f"reading spot prices failed: {err!r}"})
