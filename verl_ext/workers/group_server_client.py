"""One rollout server for a GRPO group's requests: ``group_server_client(client)``.

verl's client takes a server from the global load balancer actor and hands it back around every request: two Ray
calls per sample. The copy made here holds one server while any of the group's requests is in flight, so a group
costs two, and its prompt is prefilled on one replica. The balancer then counts a group as one in-flight request,
which balances groups of equal size alike.
"""

import asyncio

from verl_ext.compat.verl import acquire_server, is_verls_llm_client, release_server, with_server_routing


def group_server_client(client):
    """A copy of verl's ``LLMServerClient`` that sends one GRPO group's requests to one rollout server.

    For single-turn groups (the balancer's stickiness keys on request ids, which a held server bypasses between
    turns). Any other client class (the fully async one retries while the pool is empty, and resumes partial
    rollouts), or ``full_determinism`` (which routes each request by its id), keeps verl's per-request routing.
    """
    if not is_verls_llm_client(client) or getattr(client.config.actor_rollout_ref.rollout, "full_determinism", False):
        return client
    lease = ServerLease(client)
    return with_server_routing(client, lease.acquire, lease.release)


class ServerLease:
    """One server taken from the balancer while any of its users' requests runs: the first request acquires it
    through the client, the last one to finish releases it. Touched on the worker's event loop only."""

    def __init__(self, client):
        self._client = client
        self._server: asyncio.Future | None = None  # -> (server id, handle)
        self._request_id: str | None = None  # the one it was acquired for: the balancer may look it up at release
        self._users = 0

    async def acquire(self, request_id: str, **fields):
        if self._server is None:
            self._server = asyncio.ensure_future(acquire_server(self._client, request_id, **fields))
            self._request_id = request_id
        server = self._server
        self._users += 1
        try:
            # shielded: one user's cancellation must not cancel the acquisition the others wait on
            return await asyncio.shield(server)
        except BaseException:
            self._leave(server)  # verl's generate releases only what it acquired
            raise

    def release(self, server_id: str, request_id: str | None = None) -> None:
        self._leave(self._server)

    def _leave(self, server: asyncio.Future) -> None:
        self._users -= 1
        if self._users == 0:
            self._server = None
            request_id = self._request_id
            # at once if acquired; else when the balancer answers
            server.add_done_callback(lambda acquired: self._release_acquired(acquired, request_id))

    def _release_acquired(self, server: asyncio.Future, request_id: str) -> None:
        if not server.cancelled() and server.exception() is None:
            release_server(self._client, server.result()[0], request_id=request_id)
