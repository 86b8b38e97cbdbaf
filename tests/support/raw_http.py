"""Reading raw HTTP off a socket, for the tests of what only the bytes on a connection show: heads, stalled or
vanishing clients, resets."""


def receive_until(sock, done, data=b""):
    """``data`` and what ``sock`` receives after it, until ``done(data)`` holds or the peer closes the connection."""
    while not done(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def receive_all(sock, ended_by=()):
    """What ``sock`` receives until the peer closes the connection, or until an error of ``ended_by`` ends it."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ended_by:
        pass
    return data
