#!/usr/bin/env bash
# Compose smoke test (`make compose-test`; not part of `make test`): the
# stack of docker-compose.yml brought up as a user would, on this machine.
#
#  1. A Docker engine: the running one, else dockerd started here with
#     --storage-driver=vfs (Debian's docker.io installed when missing);
#     `docker compose` (v2) or `docker-compose` (v1), whichever exists.
#  2. The base images of deploy/Dockerfile and docker-compose.yml: present,
#     pulled, or, when the registry cannot be reached, LOCAL STAND-INS built
#     from Debian's packages with debootstrap (scripts/standin/). A stand-in
#     carries the official image's tag so that the Dockerfile and the
#     compose file run unchanged; it is not that image, and it is built for
#     this test only.
#  3. The stack up under its own project name, with the client socket in a
#     host folder, reached as the host user CLAWMESH_UID (not root).
#  4. From the host, through the socket: socat's handshake, the echo plugin
#     installed into the data volume with the CLI, a scripted turn with a
#     tool call (bin/clawmesh call), a token paired with
#     `exec gateway clawmesh token create` and used from the host.
#  5. The sandbox scaled to 3: turns until every replica served a call, then
#     several clients' turns while one replica is stopped: every turn
#     finishes.
#  6. Everything torn down (containers, volumes, network, the host folder);
#     dockerd stopped if this script started it. Images stay, for the next
#     run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

log() { printf '== %s\n' "$*"; }
fail() {
	printf 'FAIL: %s\n' "$*" >&2
	exit 1
}

WORK=$(mktemp -d /tmp/clawmesh-compose.XXXXXX)
chmod 0755 "$WORK" # the host user reaches the socket folder through it
CACHE=${CLAWMESH_STANDIN_CACHE:-/var/tmp/clawmesh-standin}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

# The stack of this test never meets a user's: its own project (containers,
# network, volumes), image tag and socket folder.
export COMPOSE_PROJECT_NAME=clawmesh-smoke
export CLAWMESH_IMAGE=clawmesh:smoke
export CLAWMESH_RUN_DIR="$WORK/run"
if [ "$(id -u)" != 0 ]; then
	: "${CLAWMESH_UID:=$(id -u)}" "${CLAWMESH_GID:=$(id -g)}"
fi
export CLAWMESH_UID=${CLAWMESH_UID:-1000} CLAWMESH_GID=${CLAWMESH_GID:-1000}
SOCK="$CLAWMESH_RUN_DIR/daemon.sock"

STARTED_DOCKERD=
STACK_UP=
cleanup() {
	local rc=$?
	set +e
	if [ -n "$STACK_UP" ]; then
		if [ "$rc" != 0 ]; then
			log "the run failed: last log lines of every container"
			compose logs --no-color --tail=30
		fi
		log "tearing down: compose down -v"
		compose down -v --remove-orphans
	fi
	rm -rf "$WORK"
	if [ -n "$STARTED_DOCKERD" ]; then
		log "stopping the dockerd this script started (pid $STARTED_DOCKERD)"
		kill "$STARTED_DOCKERD" && wait "$STARTED_DOCKERD"
	fi
	if [ "$rc" = 0 ]; then log "PASS"; else log "FAIL (exit $rc)"; fi
	exit "$rc"
}
trap cleanup EXIT

# until SECONDS CMD...: polls CMD (quietly) until it succeeds.
until_ok() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 1
	done
}

apt_install() {
	[ "$(id -u)" = 0 ] || fail "$* missing; install it (apt-get install $*) or run as root"
	log "installing $* from Debian's packages"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# as_user runs a host client as CLAWMESH_UID, the stack's operator.
as_user() {
	if [ "$(id -u)" = "$CLAWMESH_UID" ]; then
		"$@"
	else
		setpriv --reuid="$CLAWMESH_UID" --regid="$CLAWMESH_GID" --clear-groups -- "$@"
	fi
}

# --- 1. engine and compose -------------------------------------------------
if ! docker info >/dev/null 2>&1; then
	command -v dockerd >/dev/null || { apt-get update -qq >/dev/null || true; apt_install docker.io; }
	[ "$(id -u)" = 0 ] || fail "no Docker engine answers and only root may start one"
	log "no Docker engine answers: starting dockerd --storage-driver=vfs"
	dockerd --storage-driver=vfs >"$WORK/dockerd.log" 2>&1 &
	STARTED_DOCKERD=$!
	until_ok 60 docker info || fail "dockerd did not start: $(tail -5 "$WORK/dockerd.log")"
fi
if docker compose version >/dev/null 2>&1; then
	COMPOSE=(docker compose)
else
	command -v docker-compose >/dev/null || apt_install docker-compose
	COMPOSE=(docker-compose)
fi
compose() { "${COMPOSE[@]}" -f "$ROOT/docker-compose.yml" "$@"; }
log "engine: $(docker version --format '{{.Server.Version}}'), compose: $(compose version --short 2>/dev/null || compose version | head -1)"
command -v socat >/dev/null || apt_install socat
# Without buildx the CLI falls back to the classic builder, which is all
# the Dockerfiles need.
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0

# --- 2. base images --------------------------------------------------------
dockerfile_arg() { sed -n "s/^ARG $1=//p" "$ROOT/deploy/Dockerfile"; }
compose_image() {
	awk -v svc="  $1:" '$0 == svc {in_svc = 1; next} in_svc && /^  [^ ]/ {in_svc = 0} in_svc && $1 == "image:" {print $2; exit}' "$ROOT/docker-compose.yml"
}
BUILD_IMAGE=$(dockerfile_arg BUILD_IMAGE)
RUNTIME_IMAGE=$(dockerfile_arg RUNTIME_IMAGE)
POSTGRES_IMAGE=$(compose_image postgres)
NATS_IMAGE=$(compose_image nats)
for v in BUILD_IMAGE RUNTIME_IMAGE POSTGRES_IMAGE NATS_IMAGE; do
	[ -n "${!v}" ] || fail "cannot read $v from deploy/Dockerfile or docker-compose.yml"
done

standin_debian() {
	local tar="$CACHE/bookworm-minbase.tar"
	if [ ! -s "$tar" ]; then
		command -v debootstrap >/dev/null || apt_install debootstrap
		mkdir -p "$CACHE"
		log "debootstrap --variant=minbase bookworm ($DEBIAN_MIRROR)"
		debootstrap --variant=minbase bookworm "$WORK/rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
			fail "debootstrap: $(tail -5 "$WORK/debootstrap.log")"
		# The official image follows bookworm's point and security updates.
		printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
			"$DEBIAN_MIRROR" "$DEBIAN_MIRROR" "$DEBIAN_SECURITY_MIRROR" >"$WORK/rootfs/etc/apt/sources.list"
		tar -C "$WORK/rootfs" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
		rm -rf "$WORK/rootfs"
	fi
	docker import --change 'CMD ["bash"]' "$tar" "$1" >/dev/null
}

standin_golang() {
	local want=${1#golang:}
	want=go${want%%-*}
	local have
	have=$(go env GOVERSION)
	case "$have" in "$want" | "$want".*) ;; *) fail "the golang stand-in copies this machine's Go ($have), which is not $want" ;; esac
	mkdir -p "$WORK/golang/local-ca"
	cp -a "$(go env GOROOT)" "$WORK/golang/go"
	if [ -d /usr/local/share/ca-certificates ]; then
		find /usr/local/share/ca-certificates -name '*.crt' -exec cp {} "$WORK/golang/local-ca/" \;
	fi
	docker build -q -f "$ROOT/scripts/standin/golang.Dockerfile" --build-arg BASE="$RUNTIME_IMAGE" -t "$1" "$WORK/golang" >/dev/null
	rm -rf "$WORK/golang"
}

standin_postgres() {
	docker build -q -f "$ROOT/scripts/standin/postgres.Dockerfile" --build-arg BASE="$RUNTIME_IMAGE" -t "$1" "$ROOT/scripts/standin" >/dev/null
	log "  stand-in $1 runs $(docker run --rm --entrypoint postgres "$1" --version)"
}

standin_nats() {
	local version
	version=$(awk '$1 == "github.com/nats-io/nats-server/v2" {print $2}' "$ROOT/go.mod")
	[ "v${1#nats:}" = "$version-alpine" ] || log "  note: $1 stands in with nats-server $version (go.mod)"
	mkdir -p "$WORK/nats"
	(cd "$WORK" && GOBIN="$WORK/nats" CGO_ENABLED=0 GOFLAGS=-mod=mod go install "github.com/nats-io/nats-server/v2@$version")
	docker build -q -f "$ROOT/scripts/standin/nats.Dockerfile" --build-arg BASE="$RUNTIME_IMAGE" -t "$1" "$WORK/nats" >/dev/null
	rm -rf "$WORK/nats"
}

# ensure_image TAG BUILDER: the image as it is, pulled, or stood in.
ensure_image() {
	if docker image inspect "$1" >/dev/null 2>&1; then
		log "$1: present"
	elif docker pull -q "$1" >/dev/null 2>&1; then
		log "$1: pulled"
	else
		log "$1: the registry cannot be reached; building a LOCAL STAND-IN from Debian's packages"
		"$2" "$1"
	fi
}
ensure_image "$RUNTIME_IMAGE" standin_debian # the others' stand-ins start from it
ensure_image "$BUILD_IMAGE" standin_golang
ensure_image "$POSTGRES_IMAGE" standin_postgres
ensure_image "$NATS_IMAGE" standin_nats

# --- 3. up -----------------------------------------------------------------
log "host binaries and the echo plugin"
make -s build >/dev/null
mkdir -p "$WORK/plugins/echo"
GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o "$WORK/plugins/echo/plugin.wasm" ./plugins/examples/echo
cp plugins/examples/echo/manifest.toml "$WORK/plugins/echo/"
CLI="$ROOT/bin/clawmesh"

log "building $CLAWMESH_IMAGE (CLAWMESH_UID=$CLAWMESH_UID)"
start=$SECONDS
compose build setup >"$WORK/build.log" 2>&1 || fail "image build: $(tail -20 "$WORK/build.log")"
log "  built in $((SECONDS - start)) s"
STACK_UP=1
log "compose up -d"
compose up -d
container_health() { docker inspect -f '{{.State.Health.Status}}' "$1"; }
healthy() {
	local ids id
	ids=$(compose ps -q "$1")
	[ -n "$ids" ] || return 1
	for id in $ids; do
		[ "$(container_health "$id")" = healthy ] || return 1
	done
}
until_ok 180 healthy gateway || fail "the gateway is not healthy"
compose ps

# PostgreSQL came up healthy under read_only, cap_drop ALL with the
# five capabilities its entrypoint needs, and no-new-privileges.
pg=$(compose ps -q postgres)
read -r ro caps < <(docker inspect -f '{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapAdd}}' "$pg")
log "postgres: read-only root file system $ro, capabilities added $caps"
[ "$ro" = true ] || fail "postgres runs with a writable root file system"

# Every running container came up under its memory and process bounds
# (mem_limit, pids_limit), and the Go ones with GOMEMLIMIT under it.
for id in $(compose ps -q); do
	read -r name mem pids < <(docker inspect -f '{{.Name}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}' "$id")
	[ "$mem" -gt 0 ] 2>/dev/null || fail "$name runs without a memory limit"
	[ "$pids" -gt 0 ] 2>/dev/null || fail "$name runs without a process limit"
	log "  $name: memory limit $((mem >> 20)) MiB, at most $pids processes"
done

# The config service's key for secrets at rest is on its own volume,
# which no other container mounts (it was in the shared data volume).
log "the config key: in the config service's volume, in no other container"
compose exec -T config test -s /data/.secret_key || fail "the config service has no key at /data/.secret_key"
for svc in session upload-staging plugin-sandbox durable-bridge gateway; do
	compose exec -T "$svc" test ! -e /data/.secret_key || fail "$svc can see the config key at /data/.secret_key"
done

# --- 4. the host user through the socket -----------------------------------
read -r owner mode < <(stat -c '%u %a' "$SOCK")
log "socket $SOCK: owner uid $owner, mode $mode"
[ "$owner" = "$CLAWMESH_UID" ] && [ "$mode" = 600 ] || fail "socket owned by $owner with mode $mode"

# Collie's private socket, from the durable bridge, beside it.
read -r owner mode < <(stat -c '%u %a' "$CLAWMESH_RUN_DIR/durable.sock")
log "socket $CLAWMESH_RUN_DIR/durable.sock: owner uid $owner, mode $mode"
[ "$owner" = "$CLAWMESH_UID" ] && [ "$mode" = 600 ] || fail "durable socket owned by $owner with mode $mode"

log "socat as uid $CLAWMESH_UID: initialize, status"
hello=$(printf '%s\n' \
	'{"jsonrpc":"2.0","method":"initialize","params":{"protocolVersion":1},"id":1}' \
	'{"jsonrpc":"2.0","method":"status","params":{},"id":2}' |
	as_user socat -t 5 - "UNIX-CONNECT:$SOCK")
printf '%s\n' "$hello" | cut -c1-200
grep -q '"principal_id":"shared-operator"' <<<"$hello" || fail "the host user is not the operator"
grep -q '"id":2,"result"' <<<"$hello" || fail "status failed"

log "installing the echo plugin into the data volume (compose run ... clawmesh plugin install)"
compose run --rm --no-deps -T -v "$WORK/plugins/echo:/src:ro" gateway clawmesh plugin install /src

# field NAME: the first "NAME": "value" of stdin.
field() { sed -n "s/.*\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" | head -1; }
new_session() { as_user "$CLI" call --socket "$SOCK" "$@" session/new '{}' | field session_id; }
# tool_turn SESSION MSG...: one turn calling wasm_echo once per MSG.
tool_turn() {
	local sid=$1 prompt="" m
	shift
	for m in "$@"; do prompt+="/tool wasm_echo {\\\"msg\\\":\\\"$m\\\"}\\n"; done
	as_user "$CLI" call --socket "$SOCK" --timeout 2m session/prompt "{\"session_id\":\"$sid\",\"prompt\":\"$prompt\"}"
}

log "a scripted turn with a tool call, from the host (bin/clawmesh call)"
sid=$(new_session)
[ -n "$sid" ] || fail "session/new"
echo_ready() { tool_turn "$sid" ready | grep -q '"raw_output":"ready"'; }
until_ok 90 echo_ready || fail "the echo plugin never answered"
tool_turn "$sid" hello-from-the-host | tee "$WORK/turn.out" | cut -c1-160
grep -q '"type":"tool_call"' "$WORK/turn.out" || fail "no tool_call update"
grep -q '"raw_output":"hello-from-the-host"' "$WORK/turn.out" || fail "no tool_result"
grep -q '"outcome": "completed"' "$WORK/turn.out" || fail "the turn did not complete"

log "pairing a token through the config service's TCP address (exec gateway clawmesh token create)"
compose exec -T gateway clawmesh config set permission_profiles.smoke.agents=default users.smoke.permission_profiles=smoke
token=$(compose exec -T gateway clawmesh token create --user smoke)
case "$token" in cmt_*) ;; *) fail "token create printed $token" ;; esac
as_user "$CLI" call --socket "$SOCK" --token "$token" session/new '{"agent_alias":"default"}' | grep -q '"session_id"' ||
	fail "the paired token does not open a session"
log "  the token opens a session as user smoke"

# --- 5. three sandboxes ----------------------------------------------------
log "compose up -d --scale plugin-sandbox=3"
compose up -d --no-recreate --scale plugin-sandbox=3
until_ok 180 healthy plugin-sandbox || fail "the sandbox replicas are not healthy"
mapfile -t sandboxes < <(compose ps -q plugin-sandbox)
[ "${#sandboxes[@]}" = 3 ] || fail "${#sandboxes[@]} sandbox containers"
served() { docker logs "$1" 2>&1 | grep -c '"msg":"tool executed"' || true; }
counts() {
	local id out=""
	for id in "${sandboxes[@]}"; do out+="${id:0:12}=$(served "$id") "; done
	echo "$out"
}
every_replica_served() {
	local id
	tool_turn "$sid" a b c >/dev/null
	for id in "${sandboxes[@]}"; do [ "$(served "$id")" -gt 0 ] || return 1; done
}
start=$SECONDS
# The clients' connections reach a new replica once the sandbox's
# connection age (30 s) sends them back to DNS.
until_ok 240 every_replica_served || fail "not every replica served a call: $(counts)"
log "every replica served calls after $((SECONDS - start)) s: $(counts)"

CLIENTS=3 AFTER=10
log "$CLIENTS host clients running turns (2 tool calls each); one replica stopped mid-traffic"
# Each client runs turns until the replica is stopped and then AFTER more,
# so that turns run before, during and after the stop.
client() {
	local c=$1 t=0 after=0 s
	s=$(new_session)
	while [ "$after" -lt "$AFTER" ] && [ "$t" -lt 400 ]; do
		t=$((t + 1))
		[ -e "$WORK/stopped" ] && after=$((after + 1))
		if tool_turn "$s" "c$c-t$t-a" "c$c-t$t-b" >"$WORK/c$c-t$t.out" 2>&1; then
			echo "ok $c $t" >>"$WORK/turns.log"
		else
			echo "error $c $t" >>"$WORK/turns.log"
		fi
	done
}
turns_done() { [ "$(wc -l <"$WORK/turns.log")" -ge "$1" ]; }
: >"$WORK/turns.log"
pids=()
for ((c = 1; c <= CLIENTS; c++)); do
	client "$c" &
	pids+=($!)
done
until_ok 120 turns_done $((2 * CLIENTS)) || fail "no turn finished"
victim=${sandboxes[0]}
before_stop=$(wc -l <"$WORK/turns.log")
alive_before=$(($(served "${sandboxes[1]}") + $(served "${sandboxes[2]}")))
log "  stopping sandbox ${victim:0:12} after $before_stop turns; served so far: $(counts)"
start=$SECONDS
docker stop "$victim" >/dev/null
log "  stopped in $((SECONDS - start)) s, exit code $(docker inspect -f '{{.State.ExitCode}}' "$victim") (0: drained); $(($(wc -l <"$WORK/turns.log") - before_stop)) turns finished meanwhile"
touch "$WORK/stopped"
for p in "${pids[@]}"; do wait "$p"; done
total=$(wc -l <"$WORK/turns.log")
completed=$(cat "$WORK"/c*-t*.out | grep -c '"outcome": "completed"' || true)
ok_results=$(cat "$WORK"/c*-t*.out | grep '"type":"tool_result"' | grep -c '"status":"completed"' || true)
all_results=$(cat "$WORK"/c*-t*.out | grep -c '"type":"tool_result"' || true)
log "  turns: $total run ($before_stop before the stop), $completed completed; tool results: $ok_results of $all_results succeeded"
log "  served per replica: $(counts)(stopped: ${victim:0:12})"
grep -q '^error' "$WORK/turns.log" && fail "turns failed: $(grep '^error' "$WORK/turns.log" | tr '\n' ' ')"
[ "$completed" = "$total" ] || fail "$completed of $total turns completed"
[ "$total" -gt "$before_stop" ] || fail "no turn ran after the stop"
alive_after=$(($(served "${sandboxes[1]}") + $(served "${sandboxes[2]}")))
[ "$alive_after" -gt "$alive_before" ] || fail "the replicas alive served nothing after the stop"
