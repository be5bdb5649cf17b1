"""A packet flood served on the core it runs on: THREADS senders (default 2)
send small UDP datagrams to this host's own address as fast as they can,
until killed. Each datagram is received in a NET_RX softirq on the sending
CPU (loopback delivery runs the receive path in the sender's softirq, as a
NIC's interrupts would on the core they are steered to), so the core the
testbed's exec fault pins this to serves a softirq storm. A receiver drains
the port so that the whole receive path runs. Used by the testbed's exec
fault."""
import socket
import sys
import threading

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 2


def main():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    port = rx.getsockname()[1]

    def drain():
        while True:
            rx.recv(2048)

    def send():
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        payload = b"x" * 64
        while True:
            try:
                tx.sendto(payload, ("127.0.0.1", port))
            except OSError:
                pass  # a full receive buffer: drop and go on

    print("udp flood: %d sender(s) to 127.0.0.1:%d" % (THREADS, port), flush=True)
    threading.Thread(target=drain, daemon=True).start()
    for _ in range(THREADS):
        threading.Thread(target=send, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
