#!/usr/bin/env bash
# Prints a free TCP port on 127.0.0.1 (for the control plane, the node, dev and test daemons), picked at random
# below the kernel's ephemeral range: a port the kernel hands out (bind to port 0) is one that outgoing
# connections also take their local ports from, so a server started on it later could find it in use.
exec python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    port = random.randrange(10000, low) if low > 11000 else 0
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        port = s.getsockname()[1]
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("free-port: no free port below the ephemeral range")
'
