"""Identity keys: an ed25519 key pair per device, and signing/verifying events.

Pure: reading and writing key files is `node.keyfile`'s job (the core does no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import nacl.bindings
import nacl.exceptions
import nacl.signing

from node.core.event import (
    EVENT_VERSION,
    KEY_BYTES,
    SIGNATURE_BYTES,
    Event,
    check_local_event,
    full_event_id,
    make_event,
    pack,
    signed_encoding,
    signing_message,
)

SEED_BYTES = 32


@dataclass(frozen=True)
class Identity:
    """A signing key and its public half (the author key in every event)."""

    signing_key: nacl.signing.SigningKey

    @classmethod
    def generate(cls) -> "Identity":
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> "Identity":
        """Deterministic identity (simulations and tests pass seeded bytes)."""
        if len(seed) != SEED_BYTES:
            raise ValueError(f"seed must be {SEED_BYTES} bytes")
        return cls(nacl.signing.SigningKey(seed))

    @cached_property
    def public_key(self) -> bytes:
        # Cached: every signed event names it, and deriving the bytes from the
        # VerifyKey object each time cost a microsecond per event.
        return bytes(self.signing_key.verify_key)

    def sign(self, message: bytes) -> bytes:
        # The binding directly: SigningKey.sign wraps the result in objects we slice anyway.
        return nacl.bindings.crypto_sign(message, self._secret)[:SIGNATURE_BYTES]

    @cached_property
    def _secret(self) -> bytes:
        return self.signing_key._signing_key  # libsodium's 64-byte secret key

    @property
    def seed(self) -> bytes:
        """The 32-byte seed `from_seed` takes back (what a key file stores)."""
        return bytes(self.signing_key)


def sign_event(
    identity: Identity,
    *,
    topic: bytes,
    seq: int,
    parents: tuple[bytes, ...] | list[bytes],
    timestamp_ms: int,
    kind: str,
    payload: bytes = b"",
    state_key: str | None = None,
    auth: tuple[bytes, ...] | list[bytes] = (),
) -> Event:
    """Build, sign and encode an event; parents and auth refs are sorted for the caller."""
    parents_t = tuple(sorted(parents))
    auth_t = tuple(sorted(auth))
    author = identity.public_key
    # `_body_fields` inline, tuples as they are: msgpack writes a tuple as the
    # same array a list gives, and this runs once per local event.
    packed_body = pack([EVENT_VERSION, topic, author, seq, parents_t, auth_t, timestamp_ms, kind,
                        state_key, payload])
    message, digest = signing_message(packed_body, payload)
    signature = identity.sign(message)
    raw = signed_encoding(packed_body, signature)
    check_local_event(raw, parents_t, auth_t, kind, state_key)
    return make_event(
        EVENT_VERSION, topic, author, seq, parents_t, auth_t, timestamp_ms, kind, state_key,
        payload, signature, raw, full_event_id(raw, len(payload), digest), digest,
    )


def verify_signature(event: Event) -> bool:
    """True if `event.signature` is the author's ed25519 signature over its body."""
    if len(event.author) != KEY_BYTES or len(event.signature) != SIGNATURE_BYTES:
        return False
    try:
        nacl.bindings.crypto_sign_open(
            event.signature + event.signing_body(), event.author)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
        return False
    return True
