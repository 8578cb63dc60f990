/*
 * fuzz_http.c — libFuzzer target for the HTTP server (src/server): the OpenAI request parser
 * and the whole request path through a live server.
 *
 * At start-up a server (server_start: libmicrohttpd, scheduler, tokenizer) is started on a free
 * loopback port with the micro Qwen3.5 GGUF of the fuzz corpus, an API key, 4 generated tokens
 * at most per request and a 64 KiB body limit. Each input is:
 *   first byte even: raw bytes sent on a new TCP connection (request line, headers, body), the
 *     answer read until the server closes or 2 s of silence; with bit 1 clear the client then
 *     closes its sending side (the server may treat that as a disconnect and drop a pending
 *     answer), with bit 1 set it keeps it open and stops reading after 0.3 s of silence (an
 *     incomplete request); the server must stay up (health check after every 64 inputs);
 *   first byte odd: a request body given to oai_parse (chat if bit 1 is clear, else
 *     completions); an accepted request's fields are range-checked, and response/chunk JSON
 *     built from the body's bytes must parse back.
 * Seeds: tests/fuzz/corpus/fuzz_http/ (requests against every endpoint, streaming, bad auth).
 */
#include "fuzz_util.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "base/alloc.h"
#include "server/openai.h"
#include "server/server.h"

#define MODEL "tests/fuzz/corpus/fuzz_gguf/qwen35-micro-q8_0.gguf"

static struct qwenrt_model *model;
static struct server *srv;
static int port;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = 1;
    if (qwenrt_model_load(MODEL, &mp, &model, &err)) {
        fprintf(stderr, "fuzz_http: %s (run from the repository root)\n", err.message);
        abort();
    }
    struct server_params sp = server_default_params();
    sp.port = 0;
    sp.api_key = "fuzz-key";
    sp.model_id = "micro";
    sp.n_parallel = 2;
    sp.n_ctx = 256;
    sp.n_threads = 1;
    sp.queue_max = 8;
    sp.cache_bytes = 1u << 20;
    sp.max_tokens = 4;
    sp.max_body = 64u << 10;
    sp.timeout_s = 5;
    sp.max_connections = 16;
    sp.log_requests = false;
    if (server_start(model, &sp, &srv, &err)) {
        fprintf(stderr, "fuzz_http: server_start: %s\n", err.message);
        abort();
    }
    port = server_port(srv);
    return 0;
}

/* Sends req on a fresh connection and reads the answer into buf; returns bytes read, -1 when
 * the server cannot be reached. */
static long exchange(const uint8_t *req, size_t n, bool half_close, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    fuzz_check(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(fd, req + off, n - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    if (half_close)
        shutdown(fd, SHUT_WR);
    long got = 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (poll(&pfd, 1, half_close ? 2000 : 300) > 0) {
        ssize_t r = recv(fd, buf + got, cap - 1 - (size_t)got, 0);
        if (r <= 0)
            break;
        got += r;
        if ((size_t)got >= cap - 1)
            got = 0; /* keep reading, keep the tail */
    }
    buf[got] = 0;
    close(fd);
    return got;
}

static void check_alive(void)
{
    static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    static char buf[4096];
    long n = exchange((const uint8_t *)health, sizeof(health) - 1, true, buf, sizeof(buf));
    fuzz_check(n > 0 && strstr(buf, "200") && strstr(buf, "\"ok\""));
}

static void parse_body(const uint8_t *data, size_t size)
{
    enum oai_kind kind = (data[0] & 2) ? OAI_COMPLETION : OAI_CHAT;
    char *body = fuzz_strdup(data + 1, size - 1);
    struct oai_limits lim = {.model_id = "micro", .max_tokens = 16, .fmt = CHAT_FORMAT_QWEN35};
    struct oai_request r;
    struct oai_error e;
    memset(&r, 0, sizeof(r));
    memset(&e, 0, sizeof(e));
    if (oai_parse(kind, body, size - 1, &lim, &r, &e)) {
        fuzz_check(r.prompt != NULL);
        fuzz_check(r.max_tokens >= 0 && r.max_tokens <= lim.max_tokens);
        fuzz_check(r.n >= 1 && r.n <= OAI_N_MAX && r.n_prompts >= 1 && r.n_prompts <= OAI_PROMPTS_MAX &&
                   r.n * r.n_prompts <= OAI_JOBS_MAX);
        fuzz_check(r.sp.n_logit_bias >= 0 && r.sp.n_logit_bias <= OAI_LOGIT_BIAS_MAX &&
                   (r.sp.n_logit_bias == 0 || r.sp.logit_bias == r.bias));
        oai_request_free(&r);
    } else {
        fuzz_check(e.status >= 400 && e.status < 600);
        char *j = oai_error_json(&e);
        json_t *doc = j ? json_loads(j, 0, NULL) : NULL;
        fuzz_check(doc != NULL);
        json_decref(doc);
        xfree(j);
    }
    /* responses carry generated text (always valid UTF-8): the JSON must stay valid */
    json_t *probe = json_stringn(body, size - 1);
    if (!probe) {
        free(body);
        return;
    }
    json_decref(probe);
    struct oai_meta m = {.kind = kind, .id = "chatcmpl-fuzz", .created = 1, .model = "micro"};
    struct oai_usage u = {3, 1, 2};
    char *resp = oai_response_json(&m, body, size - 1, "stop", &u);
    char *chunk = oai_chunk_json(&m, body, size - 1, true, NULL, NULL);
    json_t *d1 = resp ? json_loads(resp, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *d2 = chunk ? json_loads(chunk, JSON_ALLOW_NUL, NULL) : NULL;
    fuzz_check(d1 != NULL && d2 != NULL);
    json_decref(d1);
    json_decref(d2);
    xfree(resp);
    xfree(chunk);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned count;
    static char buf[1 << 16];
    if (size == 0)
        return 0;
    if (data[0] & 1) {
        parse_body(data, size);
        return 0;
    }
    fuzz_check(exchange(data + 1, size - 1, !(data[0] & 2), buf, sizeof(buf)) >= 0);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "answer: %.300s\n", buf);
    if (++count % 64 == 0)
        check_alive();
    return 0;
}
