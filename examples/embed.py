#!/usr/bin/python3
"""examples/embed.py: a Python host that runs two blocks in one forkbox sandbox
with forkbox_embed, answering their tool calls with its own functions, and
reads back the file a block wrote. tests/embed runs it.

    python3 examples/embed.py [FORKBOX]   (default: $FORKBOX, else forkbox on $PATH)
"""
import os
import sys
import tempfile

import forkbox_embed


def add(a, b):
    """Add two numbers (runs here, on the host)."""
    return a + b


def lookup(city):
    """A host-side lookup that can fail."""
    if city != "Paris":
        raise KeyError(f"no data for {city}")
    return {"city": city, "temp_c": 21}


def main() -> int:
    forkbox = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory() as ws:
        os.chmod(ws, 0o777)  # the sandbox writes as an unprivileged id of its own
        tools = {"add": add, "weather.lookup": lookup}
        with forkbox_embed.Sandbox(tools, workspace=ws, forkbox=forkbox) as sb:
            print("ready: protocol", sb.ready["protocol_version"])
            r = sb.run("from tools import add\n"
                       "total = add(a=2, b=40)\n"
                       "print('the host says', total)\n"
                       "open('answer.txt', 'w').write(f'{total}\\n')\n")
            print("block 1:", r.exit_code, r.stdout.strip(), [c["name"] for c in r.tool_calls])
            r = sb.run("from tools import weather\n"
                       "print(weather.lookup(city='Paris')['temp_c'], total)\n"
                       "weather.lookup(city='Atlantis')\n")
            print("block 2:", r.exit_code, r.stdout.strip(), r.stderr.strip().splitlines()[-1])
        with open(os.path.join(ws, "answer.txt")) as f:
            print("workspace: answer.txt:", f.read().strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
