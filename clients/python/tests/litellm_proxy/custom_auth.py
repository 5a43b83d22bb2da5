"""The test proxies' keys, without LiteLLM's database (its virtual keys need
Prisma): LiteLLM's documented ``general_settings.custom_auth``. A key names
its team (the ctxbudget tenant), user and tier (in the key's metadata);
``sk-native-*`` keys carry LiteLLM's own limits instead, for comparison."""

from fastapi import Request
from litellm.proxy._types import ProxyException, UserAPIKeyAuth

KEYS = {
    "sk-conc": dict(team_id="conc", user_id="u", metadata={"tier": "conc"}),
    "sk-rpm": dict(team_id="rpm", user_id="u", metadata={"tier": "rpm"}),
    "sk-tpm": dict(team_id="tpm", user_id="u", metadata={"tier": "tpm"}),
    "sk-stream": dict(team_id="stream", user_id="u", metadata={"tier": "stream"}),
    "sk-cut": dict(team_id="cut", user_id="u", metadata={"tier": "stream"}),
    "sk-traced": dict(team_id="traced", user_id="u", metadata={"tier": "stream"}),
    "sk-blocked": dict(team_id="blocked", user_id="u", metadata={"tier": "stream"}),
    "sk-gone": dict(team_id="gone", user_id="u", metadata={"tier": "gone"}),
    "sk-fmt": dict(team_id="fmt", user_id="u", metadata={"tier": "fmt"}),
    "sk-sess": {"team_id": "sess", "user_id": "u", "metadata": {"tier": "sess"}},
    "sk-badtier": dict(team_id="badtier", user_id="u", metadata={"tier": "no-such-tier"}),
    "sk-badid": dict(team_id="bad\tteam", user_id="u", metadata={"tier": "stream"}),
    "sk-native-conc": dict(team_id="n-conc", user_id="n", max_parallel_requests=5, metadata={}),
    "sk-native-rpm": dict(team_id="n-rpm", user_id="n", rpm_limit=50, metadata={}),
    "sk-native-tpm": dict(team_id="n-tpm", user_id="n", tpm_limit=3000, metadata={}),
}


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    spec = KEYS.get(api_key)
    if spec is None:
        raise ProxyException(message="invalid api key", type="auth_error", param="api_key", code=401)
    return UserAPIKeyAuth(api_key=api_key, **spec)
