"""``broker token``: a new client token and the auth-file entry that admits it."""

from __future__ import annotations

import argparse
import sys

from ._common import Subparsers, add_command

EXAMPLES = """
  broker token billing >> auth.toml             # the token is printed on stderr
  broker token billing 2>token.txt >> auth.toml
"""


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "token",
        help="make a new client token and its auth-file entry",
        description="Print a new random token (on stderr) and the [principals.NAME] table "
        "that admits it (on stdout, for the auth_file; it holds only the token's SHA-256).",
        examples=EXAMPLES,
    )
    parser.add_argument("principal", help="the principal's name in the auth file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import secrets

    from broker.auth import AuthError, check_principal_name, token_digest

    try:
        check_principal_name(args.principal, f"broker token: {args.principal!r}")
    except AuthError as error:
        print(error, file=sys.stderr)
        return 2
    # Never one starting with "-": `--token -x...` would read as an option.
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    print(f"token: {token}", file=sys.stderr)
    print(
        "# Give the client the token printed on stderr "
        "(broker pub --token, BROKER_TOKEN, token=...)."
    )
    # A name with a dot is quoted: [principals.a.b] would be table a's table b.
    name = args.principal if "." not in args.principal else f'"{args.principal}"'
    print(f"[principals.{name}]")
    print(f'token_sha256 = "{token_digest(token)}"')
    return 0
