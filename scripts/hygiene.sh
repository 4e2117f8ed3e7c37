# Sourced by scripts/test: the suite must leave the machine's own (root) network namespace as
# it found it. Tests work only inside namespaces they create; a test (or a tool it runs, such
# as podman with bridge networking) that adds a firewall rule, a route, a policy rule or an
# interface to the root namespace, or leaves a network namespace behind, fails the run.
#
#   hygiene_snapshot FILE   # before the tests
#   hygiene_check FILE      # after: prints the difference and returns 1 when there is one
#
# AMBIT_SHARED_MACHINE=1 (several suites at once on one machine, as during development) turns
# the leftover-namespace check into a warning, since another run's namespaces are not ours;
# the root-namespace firewall, route, rule and link checks stay failures.

hygiene_root_state() {
    local t
    for t in iptables-save ip6tables-save; do
        echo "## $t"
        # Counters and timestamps change with traffic; the rules themselves must not. (sed,
        # not grep: no output is not a failure under `set -o pipefail`.)
        { "$t" 2>/dev/null || echo "($t failed)"; } | sed -E '/^#/d; s/\[[0-9]+:[0-9]+\]//'
    done
    echo "## nft"
    { nft list ruleset 2>/dev/null || echo "(nft failed)"; } \
        | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/'
    echo "## routes"
    ip -4 route show table all
    ip -6 route show table all | sed -E 's/ expires [0-9]+sec//'
    echo "## rules"
    ip -4 rule
    ip -6 rule
    echo "## links"
    ip -o link show | awk -F': ' '{print $2}' | sort
}

hygiene_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | sort
}

hygiene_snapshot() {
    hygiene_root_state >"$1.root"
    hygiene_namespaces >"$1.netns"
}

hygiene_check() {
    local snap="$1" rc=0 left deadline
    if ! diff -u "$snap.root" <(hygiene_root_state) >"$snap.root.diff"; then
        log "the tests changed the root network namespace (firewall, routes, rules or links):"
        cat "$snap.root.diff" >&2
        rc=1
    fi
    # Namespaces are removed by their owners' drop handlers; give exiting processes a moment.
    deadline=$((SECONDS + 10))
    while :; do
        left=$(comm -13 "$snap.netns" <(hygiene_namespaces))
        [ -z "$left" ] || [ "$SECONDS" -ge "$deadline" ] && break
        sleep 0.5
    done
    if [ -n "$left" ]; then
        if [ "${AMBIT_SHARED_MACHINE:-}" = "1" ]; then
            log "warning: network namespaces left after the tests (may be another run's):"
            echo "$left" >&2
        else
            log "the tests left network namespaces behind:"
            echo "$left" >&2
            rc=1
        fi
    fi
    return "$rc"
}
