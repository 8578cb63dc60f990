/*
 * cmd_card.c — `qwenrt card RECORDS_DIR -o card.json`: gathers validate/bench/calibrate records
 * into a model card like seed 003, plus a Markdown summary (see src/tools/card.h).
 *
 *   qwenrt card RECORDS_DIR -o card.json [--md card.md] [--id ID] [--license L]
 *               [--source-url URL] [--conversion TEXT] [--pitfalls FILE]
 */
#include <getopt.h>
#include <stdio.h>

#include "cli/commands.h"
#include "tools/card.h"
#include "tools/records.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: qwenrt card RECORDS_DIR -o card.json [--md card.md] [--id ID] [--license L]\n"
            "         [--source-url URL] [--conversion TEXT] [--pitfalls FILE]\n");
}

int cmd_card(int argc, char **argv)
{
    static const struct option opts[] = {
        {"md", required_argument, 0, 'M'},
        {"id", required_argument, 0, 'i'},
        {"license", required_argument, 0, 'l'},
        {"source-url", required_argument, 0, 'u'},
        {"conversion", required_argument, 0, 'c'},
        {"pitfalls", required_argument, 0, 'p'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    struct card_params p = {0};
    const char *out = NULL, *md = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'M':
            md = optarg;
            break;
        case 'i':
            p.id = optarg;
            break;
        case 'l':
            p.license = optarg;
            break;
        case 'u':
            p.source_url = optarg;
            break;
        case 'c':
            p.conversion = optarg;
            break;
        case 'p':
            p.pitfalls = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind + 1 != argc || !out) {
        usage(stderr);
        return 2;
    }
    p.records_dir = argv[optind];
    json_t *card = NULL;
    struct qwenrt_error err = {0};
    int rc = 0;
    if (card_build(&p, &card, &err) || records_write(card, out, &err) ||
        (md && card_write_markdown(card, md, &err))) {
        fprintf(stderr, "qwenrt card: %s\n", err.message);
        rc = 1;
    } else {
        printf("wrote %s: %zu validations, %zu benchmarks, %zu records\n", out,
               json_array_size(json_object_get(card, "validations")),
               json_array_size(json_object_get(card, "benchmarks")),
               json_array_size(json_object_get(json_object_get(card, "device"), "records")));
    }
    json_decref(card);
    return rc;
}
