/* marked-get MARK IP PORT PATH: an HTTP/1.0 GET to IP:PORT from a socket carrying the mark MARK
 * (SO_MARK, which CAP_NET_RAW allows since Linux 5.17), with the reply on stdout. The attacker
 * probe of tests/e2e/tests/security.rs: a mark must not take a connection out of capture. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int fail(const char *what) {
    fprintf(stderr, "marked-get: %s: %s\n", what, strerror(errno));
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: marked-get MARK IP PORT PATH\n");
        return 2;
    }
    unsigned mark = (unsigned)strtoul(argv[1], NULL, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[3]))};
    if (inet_pton(AF_INET, argv[2], &to.sin_addr) != 1) {
        fprintf(stderr, "marked-get: %s is not an IPv4 address\n", argv[2]);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return fail("socket");
    if (setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark) != 0) return fail("SO_MARK");
    if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0) return fail("connect");
    char request[512];
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", argv[4], argv[2]);
    if (n < 0 || (size_t)n >= sizeof request) {
        fprintf(stderr, "marked-get: path too long\n");
        return 2;
    }
    if (write(fd, request, (size_t)n) != n) return fail("write");
    char buf[4096];
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)got, stdout);
    if (got < 0) return fail("read");
    return 0;
}
