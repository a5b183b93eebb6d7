/* netem's delay where the kernel has no netem (tests/fleetkit.py): every packet iptables
 * hands to NFQUEUE queue QUEUE is held DELAY_MS after it arrived, then accepted, in arrival
 * order. Usage: netdelay QUEUE DELAY_MS. Prints "ready" once the queue is bound; on SIGTERM
 * accepts what it holds and prints "held N packets, at most M at once, K overflows". */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define HELD_MAX (1 << 17)

struct held { uint32_t id; int64_t due_ns; };

static struct held ring[HELD_MAX];
static unsigned head, tail;                 /* ring[head..tail) wait, oldest first */
static int64_t delay_ns;
static unsigned long long total, most, overflows;
static volatile sig_atomic_t stopping;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static unsigned waiting(void) { return (tail - head) % HELD_MAX; }

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data) {
    (void)msg; (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == NULL) return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (waiting() == HELD_MAX - 1) {        /* full: dropped, as netem past its limit */
        overflows++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    ring[tail] = (struct held){id, now_ns() + delay_ns};
    tail = (tail + 1) % HELD_MAX;
    total++;
    if (waiting() > most) most = waiting();
    return 0;
}

static void release(struct nfq_q_handle *qh, int64_t until_ns) {
    while (head != tail && ring[head].due_ns <= until_ns) {
        nfq_set_verdict(qh, ring[head].id, NF_ACCEPT, 0, NULL);
        head = (head + 1) % HELD_MAX;
    }
}

static void on_term(int sig) { (void)sig; stopping = 1; }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: netdelay QUEUE DELAY_MS\n");
        return 2;
    }
    delay_ns = strtoll(argv[2], NULL, 10) * 1000000;
    struct nfq_handle *h = nfq_open();
    if (h == NULL) { perror("nfq_open"); return 1; }
    nfq_unbind_pf(h, AF_INET);
    if (nfq_bind_pf(h, AF_INET) < 0) { perror("nfq_bind_pf"); return 1; }
    struct nfq_q_handle *qh = nfq_create_queue(h, atoi(argv[1]), on_packet, NULL);
    if (qh == NULL) { perror("nfq_create_queue"); return 1; }
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) { perror("nfq_set_mode"); return 1; }
    nfq_set_queue_maxlen(qh, HELD_MAX);
    nfnl_rcvbufsiz(nfq_nfnlh(h), 16 << 20);
    int fd = nfq_fd(h);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    printf("ready\n");
    fflush(stdout);
    char buf[65536];
    while (!stopping) {
        release(qh, now_ns());
        int timeout_ms = -1;
        if (head != tail) {
            int64_t wait_ns = ring[head].due_ns - now_ns();
            timeout_ms = wait_ns <= 0 ? 0 : (int)((wait_ns + 999999) / 1000000);
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) <= 0) continue;
        for (;;) {                          /* everything queued now, then verdicts again */
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) {
                if (errno == ENOBUFS) { overflows++; continue; }
                break;
            }
            nfq_handle_packet(h, buf, (int)n);
        }
    }
    release(qh, INT64_MAX);
    printf("held %llu packets, at most %llu at once, %llu overflows\n", total, most, overflows);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
