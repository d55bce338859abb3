"""A discovery answer is bounded on what it decodes to (issue 57, part 2; SPEC "Discovery").

The client asks for ``accept-encoding: identity``; a server that compresses
anyway must not make it inflate a bomb. Real HTTP servers on loopback (an
asyncio socket server writing the bytes a careless server would) answer each
case; the bound is 1 KiB of decoded answer, checked as bytes are inflated.
"""

from __future__ import annotations

import asyncio
import gzip
import resource
import zlib
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from walchannel import DiscoveryError
from walchannel.transport.discovery import MAX_ANSWER_BYTES, discover

Answer = Callable[[], tuple[dict[str, str], bytes]]


async def serving(answer: Answer) -> AsyncIterator[str]:
    """An HTTP/1.1 server on loopback giving ``answer()`` to every GET; yields its URL."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            headers, body = answer()
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode())
            # Written in pieces, as a network delivers a large body.
            for at in range(0, len(body), 64 * 1024):
                writer.write(body[at : at + 64 * 1024])
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()
    assert all(b"accept-encoding: identity" in s.lower() for s in seen), seen


async def ask(answer: Answer) -> str:
    gen = serving(answer)
    url = await gen.__anext__()
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            return await discover(client, url, allowed_hosts=None, timeout_s=20)
    finally:
        await gen.aclose()


def gzip_bomb() -> tuple[dict[str, str], bytes]:
    # 256 MiB of the address's first bytes and zeros, about 254 KiB gzipped.
    return {"content-encoding": "gzip"}, _BOMB_GZIP


def deflate_bomb() -> tuple[dict[str, str], bytes]:
    return {"content-encoding": "deflate"}, _BOMB_DEFLATE


def _bomb(level: int, wbits: int) -> bytes:
    packer = zlib.compressobj(level, zlib.DEFLATED, wbits)
    zeros = bytes(1 << 20)
    parts = [packer.compress(b"127.0.0.1:4317")]
    parts += [packer.compress(zeros) for _ in range(256)]
    return b"".join(parts) + packer.flush()


_BOMB_GZIP = _bomb(9, 31)
_BOMB_DEFLATE = _bomb(9, 15)


@pytest.mark.asyncio
@pytest.mark.parametrize("answer", [gzip_bomb, deflate_bomb], ids=["gzip", "deflate"])
async def test_a_compressed_bomb_is_refused_without_inflating_it(answer: Answer) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DiscoveryError) as caught:
        await ask(answer)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    said = str(caught.value)
    assert f"{MAX_ANSWER_BYTES} bytes" in said, said
    # Inflating a whole network chunk first cost some 141 MiB per attempt.
    assert grown_mib < 32, f"the process grew {grown_mib:.0f} MiB"


@pytest.mark.asyncio
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "x-gzip"])
async def test_a_small_compressed_answer_is_read_though_identity_was_asked(encoding: str) -> None:
    text = b"127.0.0.1:4317\n"
    body = gzip.compress(text) if "gzip" in encoding else zlib.compress(text)
    assert await ask(lambda: ({"content-encoding": encoding}, body)) == "127.0.0.1:4317"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("headers", "body", "words"),
    [
        ({"content-encoding": "br"}, b"\x0b\x02\x80127.0.0.1:4317\x03", "content-encoding br"),
        ({"content-encoding": "gzip"}, b"not gzip at all", "cannot be decoded"),
        # Just over the bound once inflated, though small on the wire.
        ({"content-encoding": "gzip"}, gzip.compress(b"a" * (MAX_ANSWER_BYTES + 1)), "bytes"),
    ],
    ids=["unknown", "broken", "just-over"],
)
async def test_an_answer_that_cannot_be_decoded_within_the_bound_is_named(
    headers: dict[str, str], body: bytes, words: str
) -> None:
    with pytest.raises(DiscoveryError, match=words):
        await ask(lambda: (headers, body))
