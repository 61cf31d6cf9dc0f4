# Started by review-s40-private-network.test.ts (through its namespace set-up script) inside network namespaces that the
# test made itself: TCP listeners on port 80 of each address given, a DNS responder (every A question answered with
# 203.0.113.9) on UDP port 53 of `dns=ADDR`, a member of the multicast group 224.0.0.251 on UDP 5353 (`mcast=IFADDR`).
# Every connection or datagram that arrives is appended to LOG as one line ("tcp ADDR", "dns ADDR", "mcast"), so the
# test can tell that nothing reached an address the sandbox must not reach. Ends after 600 s at the latest.
import socket
import sys
import threading
import time

log_path = sys.argv[1]
lock = threading.Lock()


def record(line):
    with lock, open(log_path, "a") as f:
        f.write(line + "\n")


def tcp(family, addr):
    s = socket.socket(family)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 80))
    s.listen()
    while True:
        c, _ = s.accept()
        record(f"tcp {addr}")
        c.sendall(f"hello from {addr}\n".encode())
        c.close()


def dns(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        d, peer = s.recvfrom(512)
        record(f"dns {addr}")
        question = d[12:]
        end = question.index(0) + 5
        answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + bytes([203, 0, 113, 9])
        s.sendto(d[:2] + b"\x81\x80" + d[4:6] + b"\x00\x01\x00\x00\x00\x00" + question[:end] + answer, peer)


def mcast(ifaddr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", 5353))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton("224.0.0.251") + socket.inet_aton(ifaddr))
    while True:
        s.recvfrom(512)
        record("mcast")


for arg in sys.argv[2:]:
    if arg.startswith("dns="):
        target, args = dns, (arg[4:],)
    elif arg.startswith("mcast="):
        target, args = mcast, (arg[6:],)
    elif ":" in arg:
        target, args = tcp, (socket.AF_INET6, arg)
    else:
        target, args = tcp, (socket.AF_INET, arg)
    threading.Thread(target=target, args=args, daemon=True).start()
time.sleep(0.5)
print("ready", flush=True)
time.sleep(600)
