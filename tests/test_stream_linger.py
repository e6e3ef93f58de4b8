"""``--stream-linger-ms``: the services that serve the mesh's streams (parse, router, worker) batch their mux
sessions' plain frames by it (``services/common/mux.py``)."""

from __future__ import annotations

import pytest

from services.common import mux
from services.common.model_dir import load_model_dir
from services.launcher.supervisor import free_port
from services.parse.model_format import ModelFormat
from services.parse.server import start
from services.parse.settings import ParseSettings
from services.router.settings import RouterSettings
from services.worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(30)

SETTINGS = (ParseSettings, RouterSettings, WorkerSettings)


@pytest.mark.parametrize("settings_class", SETTINGS)
def test_the_default_is_the_mux_default_and_a_negative_linger_is_refused(settings_class: type) -> None:
    assert settings_class().stream_linger() == mux.DEFAULT_LINGER
    settings_class(stream_linger_ms=0.0).validate()
    with pytest.raises(ValueError, match="--stream-linger-ms"):
        settings_class(stream_linger_ms=-1.0).validate()


async def test_the_parse_server_batches_its_streams_by_it() -> None:
    fmt = ModelFormat(load_model_dir(""), max_model_len=4096)
    settings = ParseSettings(port=0, router_address=f"127.0.0.1:{free_port()}", stream_linger_ms=7.0)
    parse = await start(settings, model_format=fmt)
    try:
        (server,) = parse.server._muxes
        assert server._linger == 0.007
    finally:
        await parse.stop(0)
