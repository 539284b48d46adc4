"""Short fuzz runs (scripts/fuzz runs the same drivers for millions of inputs), and proof the drivers can fail."""

from __future__ import annotations

import pytest

import rmpd.fuzz
import rmpd.protocol.routing
from rmpd.fuzz import fuzz_decoder, fuzz_engine, fuzz_frames
from rmpd.protocol.packets import decode


def test_the_decoder_only_ever_raises_decode_error() -> None:
    report = fuzz_decoder(50_000, seed=1)
    assert report.ok, report.failures[:1]
    assert report.inputs == 50_000
    assert report.kinds["accepted"] > 100 and report.kinds["rejected"] > 10_000  # both paths were exercised


def test_engines_under_hostile_datagrams_keep_order_and_deliver_everything() -> None:
    report = fuzz_engine(30_000, seed=7)
    assert report.ok, report.failures[:1]
    assert report.inputs >= 30_000
    assert report.extra["delivered"] == report.extra["expected"] > 0
    assert report.kinds["replay"] > 1000 and report.kinds["field"] > 1000


def test_engines_survive_forgeries_of_their_own_views() -> None:
    report = fuzz_engine(30_000, seed=11, guarded=False)
    assert report.ok, report.failures[:1]
    assert "withheld_forgery" not in report.kinds


def test_local_frames_yield_requests_or_structured_errors() -> None:
    report = fuzz_frames(20_000, seed=3)
    assert report.ok, report.failures[:1]
    assert report.kinds["request"] > 0 and report.kinds["frame_error_bad-frame"] > 0


def test_the_drivers_report_an_exception_that_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    def fragile(data: bytes):
        if len(data) % 7 == 3:
            raise IndexError("a decoder bug")
        return decode(data)

    monkeypatch.setattr(rmpd.fuzz, "decode", fragile)
    monkeypatch.setattr(rmpd.protocol.routing, "decode", fragile)
    assert not fuzz_decoder(2_000).ok
    report = fuzz_engine(2_000)
    assert not report.ok and "a decoder bug" in report.failures[0]["error"]
