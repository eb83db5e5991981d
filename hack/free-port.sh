#!/usr/bin/env bash
# Prints a free TCP port on 127.0.0.1, picked by the kernel (for the control plane, dev and test daemons).
exec python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
