# What the gateway really serves (doctor, sparkctl/doctor/probes.py): the certificate a TLS client is shown at an
# address and port, unchecked (doctor compares it), as PEM; or the mark given and why, when nothing there speaks TLS.
# argv: address, port, the mark.
import socket
import ssl
import sys

context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), 5) as plain, context.wrap_socket(plain) as tls:
        print(ssl.DER_cert_to_PEM_cert(tls.getpeercert(True)))
except (OSError, ValueError) as error:
    print(f"{sys.argv[3]} {type(error).__name__}: {error}")
