#!/usr/bin/python3
"""examples/embed.py: a Python host that runs two blocks in one forkbox sandbox
with forkbox_embed, answering their tool calls with its own functions, and
reads back the file a block wrote. tests/embed runs it.

    python3 examples/embed.py [FORKBOX]   (default: $FORKBOX, else forkbox on $PATH)
"""
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
    with tempfile.TemporaryDirectory() as ws:  # ours, 0700: the block writes as its owner
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
        with forkbox_embed.Workspace(ws) as files:  # no symlink a block left leads out
            print("workspace: answer.txt:", files.read_text("answer.txt").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
