# Sourced by the shell integration tests: free_port prints a port that was free a moment ago,
# random below the kernel's ephemeral range (32768-60999 by default) so that no outgoing
# connection takes it before the server binds it (tests/integration/support/harness.cc's
# freePort() says more).
free_port() {
  python3 -c 'import random, socket
for _ in range(2000):
    p = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    break'
}
