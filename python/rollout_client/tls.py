"""Channel security: TLS (optionally mutual) and the bearer token sent on every call."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import grpc

PemSource = Union[bytes, str, Path, None]


def _read(source: PemSource, name: str) -> Optional[bytes]:
    """PEM bytes as given, or read from a path (str or Path); a path that cannot be read is a ValueError naming `name`."""
    if source is None or isinstance(source, bytes):
        return source
    try:
        return Path(source).read_bytes()
    except OSError as err:
        raise ValueError(f"TlsOptions.{name}: cannot read {str(source)!r}: {err.strerror or err}") from err


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the server. Each PEM may be bytes or a file path.

    root_certificates: CA that signed the server's certificate (None = the system roots).
    certificate_chain + private_key: the client's certificate, for servers that require mTLS (give both or neither).
    server_name: overrides the name checked against the server certificate (e.g. when dialling an IP address).
    """

    root_certificates: PemSource = None
    certificate_chain: PemSource = None
    private_key: PemSource = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("TlsOptions: certificate_chain and private_key go together (mTLS needs both)")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.root_certificates, "root_certificates"),
            private_key=_read(self.private_key, "private_key"),
            certificate_chain=_read(self.certificate_chain, "certificate_chain"),
        )

    def channel_options(self) -> List[Tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def call_metadata(token: Optional[str]) -> Sequence[Tuple[str, str]]:
    """The metadata of every call: `authorization: Bearer <token>` when a token is set.

    Sent as plain call metadata rather than grpc.access_token_call_credentials, which grpc refuses on an insecure
    channel: a token over plaintext is the deployment's choice (e.g. inside a cluster network), not the client's.
    """
    return (("authorization", f"Bearer {token}"),) if token else ()
