"""A fork server for mutmut's test command: the test process of each mutant starts from a
process that has already imported torch, torchrec, numba and pytest (7-10 s of wall time per
mutant on a loaded 2-core machine, most of a mutant's cost), then imports the project, which
mutmut has just rewritten, and runs pytest.

The server never imports the project: each mutant's child reads the mutated file fresh (and
writes no bytecode). A child that outlives its alarm dies by SIGALRM, which the client reports
as a failing run, as a hung test process is under the plain runner's timeout.

Exit status: 0 when the tests pass, 1 otherwise. mutmut 2 counts a mutant killed only on exit
status 1, so pytest's 2 (a collection error: the mutated module fails to import) would read as a
survivor; both commands map every failure to 1.

    python scripts/mutant_runner.py serve SOCKET              # scripts/mutants.py starts it
    python scripts/mutant_runner.py run SOCKET SECONDS ARGS   # mutmut's --runner: pytest ARGS
    python scripts/mutant_runner.py plain ARGS                # pytest ARGS in this process
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import tempfile
import threading

# Third-party only: anything of the project imported here would be the unmutated copy.
PRELOAD = ("numpy", "torch", "numba", "torchrec", "pyarrow", "polars", "typer", "pytest")


def _recv_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _exit_when_the_client_leaves(conn: socket.socket) -> None:
    """mutmut kills the client of a run past its timeout (an endless loop): the test process
    then ends too instead of burning a core until its alarm. The client shut its writing side
    after the request; POLLHUP comes when it has closed the socket altogether."""
    poller = select.poll()
    poller.register(conn, select.POLLHUP)
    while True:
        for _, event in poller.poll(1000):
            if event & (select.POLLHUP | select.POLLERR):
                os._exit(1)


def _child(conn: socket.socket, request: dict) -> None:
    """Runs pytest in this forked process and sends back its exit code and the output's tail."""
    import pytest

    os.chdir(request["cwd"])
    threading.Thread(target=_exit_when_the_client_leaves, args=(conn,), daemon=True).start()
    signal.alarm(int(request["timeout"]))
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        code = int(pytest.main(request["args"]))
        sys.stdout.flush()
        sys.stderr.flush()
        out.seek(0)
        tail = out.read()[-4000:].decode(errors="replace")
    conn.sendall(json.dumps({"code": code, "tail": tail}).encode())
    conn.close()


def serve(path: str) -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        request = json.loads(_recv_all(conn))  # the client shuts its writing side after it
        pid = os.fork()
        if pid == 0:
            server.close()
            try:
                _child(conn, request)
            finally:
                os._exit(0)
        conn.close()
        while True:  # reap finished children
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if done == 0:
                break


def run(path: str, timeout: int, args: list[str]) -> int:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    client.sendall(json.dumps({"cwd": os.getcwd(), "timeout": timeout, "args": args}).encode())
    client.shutdown(socket.SHUT_WR)
    reply = _recv_all(client)
    if not reply:  # the child died (alarm, crash) before answering
        print("test process died without an exit code", file=sys.stderr)
        return 1
    result = json.loads(reply)
    print(result["tail"])
    return 0 if result["code"] == 0 else 1


def plain(args: list[str]) -> int:
    import pytest

    return 0 if int(pytest.main(args)) == 0 else 1


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "run":
        sys.exit(run(sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
    elif sys.argv[1] == "plain":
        sys.exit(plain(sys.argv[2:]))
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}: serve, run or plain")
