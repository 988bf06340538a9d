"""Where the SGLang API key comes from: a Prefect Secret block, or an environment variable."""

from __future__ import annotations

from typing import cast

from prefect.blocks.system import Secret

from eagle3_datagen.config import ServerSpec
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.sglang.launch_command import resolve_api_key


async def api_key_for(server: ServerSpec) -> str | None:
    """The key, loaded where the config says; never a flow parameter, so never shown in the UI."""
    if server.api_key_secret:
        try:
            block = cast(Secret[str], await Secret.aload(server.api_key_secret))
        except ValueError as err:
            raise ConfigError(
                f"server.api_key_secret: no Prefect Secret block {server.api_key_secret!r}: {err}"
            ) from None
        return str(block.get())
    return resolve_api_key(server)
