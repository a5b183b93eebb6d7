# docket — every target installs what it needs first (venv, pinned packages, Kafka jars).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.docket-setup
PYTEST_ARGS ?=

.PHONY: setup kafka-client-deps debian-tools bench-tools native native-build test test-unit lint bench soak demo demo-down demo-fault screenshots deb dist test-packages clean

NATIVE_STAMP := $(VENV)/.docket-native
NATIVE_WHEELS := build/native-wheel
CARGO_ENV := PATH="$$HOME/.cargo/bin:$$PATH"

FORGETFS := build/forgetfs/release/docket-forgetfs
KAFKA_CLIENT := build/kafka-client

setup: $(STAMP) $(NATIVE_STAMP) $(FORGETFS)

$(STAMP): pyproject.toml constraints.txt broker/pom.xml audit/jobs/pom.xml $(wildcard audit/jobs/*.java) \
		packaging/build_kafka_client.py
	@command -v java >/dev/null || { echo "make setup: java (JDK 17+) is required for the local Kafka and Spark" >&2; exit 1; }
	@command -v javac >/dev/null || { echo "make setup: javac (JDK 17+) is required to build the audit jobs' Java" >&2; exit 1; }
	@command -v mvn >/dev/null || { echo "make setup: mvn (Maven) is required to fetch the Kafka and Spark connector jars" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(MAKE) --no-print-directory kafka-client-deps
	$(BIN)/python packaging/build_kafka_client.py $(KAFKA_CLIENT)
	$(BIN)/pip install --quiet --no-deps --force-reinstall $(KAFKA_CLIENT)/confluent_kafka-*.whl
	$(BIN)/pip install --quiet -c constraints.txt -e '.[audit,dashboard,dev]'
	$(BIN)/docket-broker fetch
	$(BIN)/docket-audit fetch
	@$(MAKE) --no-print-directory debian-tools
	touch $@

# The Kafka client both send paths run is built here (packaging/build_kafka_client.py:
# librdkafka with Kerberos, OIDC, TLS and zstd, and confluent-kafka on it): a compiler and the
# development files it links, and what a Kerberos sign-in needs at run time (Cyrus SASL's
# GSSAPI module, MIT's kinit, which librdkafka runs to renew its ticket).
KAFKA_CLIENT_DEBS := gcc binutils make pkgconf libc6-dev python3-dev libsasl2-dev libssl-dev \
	libcurl4-openssl-dev libzstd-dev liblz4-dev zlib1g-dev libsasl2-modules-gssapi-mit krb5-user
kafka-client-deps:
	@need=$$(for p in $(KAFKA_CLIENT_DEBS); do \
		dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null | grep -qx installed || echo $$p; \
	done | tr '\n' ' '); \
	if [ -z "$$need" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$need >/dev/null; \
	else echo "make setup: install Debian's $$need (as root): the Kafka client is built" \
		"from source with them" >&2; exit 1; fi

# Debian's Alertmanager (the alert delivery test against a real one), Prometheus' promtool
# (the alerting rules' and the Grafana dashboard's checks), chromium (the dashboard's browser
# tests, driven by Playwright: its own browser download cannot work offline), dh-virtualenv
# with debhelper (make deb), and iptables with libnetfilter_queue's headers (the fleet's
# network faults, tests/fleetkit.py: loss and partitions, and the delay tool netdelay.c in
# place of netem), rsyslog (a relay forwarding to the agent's syslog source with omfwd; its
# package must not start the system's syslog: service starts are refused for the install),
# systemd-journal-remote (writes the journal files the journald source's tests read), MIT's KDC
# with its kadmin.local (krb5-kdc, krb5-admin-server: the Kerberos tests' own realm on loopback);
# their tests are skipped without them.
debian-tools:
	@need=""; \
	command -v rsyslogd >/dev/null || [ -x /usr/sbin/rsyslogd ] || need="$$need rsyslog"; \
	command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null \
		|| need="$$need prometheus-alertmanager"; \
	command -v promtool >/dev/null || need="$$need prometheus"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	command -v dh_virtualenv >/dev/null || need="$$need dh-virtualenv debhelper dpkg-dev"; \
	command -v iptables >/dev/null || need="$$need iptables"; \
	command -v logrotate >/dev/null || [ -x /usr/sbin/logrotate ] || need="$$need logrotate"; \
	command -v zstd >/dev/null || need="$$need zstd"; \
	command -v fusermount3 >/dev/null || need="$$need fuse3"; \
	[ -x /lib/systemd/systemd-journal-remote ] || need="$$need systemd-journal-remote"; \
	[ -x /usr/sbin/krb5kdc ] || need="$$need krb5-kdc"; \
	[ -x /usr/sbin/kadmin.local ] || need="$$need krb5-admin-server"; \
	[ -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ] \
		|| need="$$need libnetfilter-queue-dev"; \
	if [ -z "$$need" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		added=""; if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
			chmod 755 /usr/sbin/policy-rc.d; added=1; fi; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$need) >/dev/null \
		|| echo "make setup: could not install$$need; their tests will be skipped" >&2; \
		if [ -n "$$added" ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	else echo "make setup: install Debian's$$need (as root) for their tests" >&2; fi

# The native send path (agent/native, Rust: PyO3 and the rdkafka crate) as a wheel in
# build/native-wheel, installed into the venv as the module docket_native (make deb installs
# the same wheel). It links the librdkafka that the venv's confluent-kafka wheel ships
# (packaging/link_librdkafka.py writes what pkg-config tells the crate's build): both send
# paths run one librdkafka. Needs cargo (rustup's, in ~/.cargo/bin, or on PATH), a C compiler
# and pkg-config (installed here as root when missing). Without cargo, make setup says so and
# goes on: the agent sends with its Python send path (broker.send_path = "auto" chooses it),
# the native tests skip.
native: $(STAMP)
	@$(MAKE) --no-print-directory native-build

native-build:
	@need=""; command -v pkg-config >/dev/null || need="$$need pkgconf"; \
	if [ -n "$$need" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends $$need) >/dev/null; fi
	rm -rf $(NATIVE_WHEELS)
	$(BIN)/python packaging/link_librdkafka.py build/librdkafka
	PKG_CONFIG_PATH=$(CURDIR)/build/librdkafka $(CARGO_ENV) \
		$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(NATIVE_WHEELS) ./agent/native
	$(BIN)/pip install --quiet --no-deps --force-reinstall $(NATIVE_WHEELS)/docket_native-*.whl
	touch $(NATIVE_STAMP)

$(NATIVE_STAMP): $(wildcard agent/native/src/*.rs) agent/native/Cargo.toml agent/native/build.rs \
		agent/native/Cargo.lock agent/native/pyproject.toml packaging/link_librdkafka.py \
		constraints.txt $(STAMP)
	@if $(CARGO_ENV) command -v cargo >/dev/null; then \
		$(MAKE) --no-print-directory native-build; \
	else echo "make setup: no cargo (Rust, https://rustup.rs) here: the native send path is" \
		"not built; the agent sends with its Python send path (the default, \"auto\"," \
		"chooses it there) and the native tests are skipped" >&2; fi

# The power-cut harness's file system (tests/forgetfs: Rust, the fuser crate, no libfuse; Debian's
# fuse3 gives fusermount3): build/forgetfs/release/docket-forgetfs, for
# tests/faults/test_power_cut_fs.py. Without cargo it is not built and that test is skipped.
$(FORGETFS): $(wildcard tests/forgetfs/src/*.rs) tests/forgetfs/Cargo.toml \
		tests/forgetfs/Cargo.lock | $(STAMP)
	@if $(CARGO_ENV) command -v cargo >/dev/null; then \
		$(CARGO_ENV) CARGO_TARGET_DIR=build/forgetfs cargo build --quiet --release --locked \
			--manifest-path tests/forgetfs/Cargo.toml; \
	else echo "make setup: no cargo here: the power-cut file system (tests/forgetfs) is not" \
		"built and its test is skipped" >&2; fi

# Two groups side by side, each a pytest session with its own clusters (tests/run_groups.py);
# PYTEST_ARGS naming tests (a path, -k, -m) run one plain session.
test: setup
	$(BIN)/python tests/run_groups.py $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check agent broker audit dashboards docket_common demo tests packaging

# Every benchmark runs, also after one fails; the target fails at the end, naming them.
# The peer shippers bench_peers.py runs beside docket (Debian's kcat, rsyslog, rsyslog-kafka),
# as root. Installing rsyslog must not start the system's syslog: service starts are refused
# for the install (policy-rc.d), and bench_peers runs its own rsyslogd with its own config.
bench-tools:
	@need=""; \
	command -v kcat >/dev/null || need="$$need kcat"; \
	command -v rsyslogd >/dev/null || need="$$need rsyslog"; \
	ls /usr/lib/*/rsyslog/omkafka.so >/dev/null 2>&1 || need="$$need rsyslog-kafka"; \
	if [ -z "$$need" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		added=""; if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
			chmod 755 /usr/sbin/policy-rc.d; added=1; fi; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$need) >/dev/null \
		|| echo "make bench-tools: could not install$$need; bench_peers leaves them out" >&2; \
		if [ -n "$$added" ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	else echo "make bench-tools: install Debian's$$need (as root) for bench_peers" >&2; fi

# Every benchmark's JSON line goes to stdout and build/bench/results.jsonl, drawn by plot.py into
# build/bench/performance.png (docs/performance.png is a copy of one run's).
bench: setup bench-tools
	$(BIN)/pip install --quiet -c constraints.txt -e '.[audit,dashboard,dev,bench]'
	@mkdir -p build/bench; : > build/bench/results.jsonl; failed=""; \
	for f in tests/bench/bench_*.py; do \
		$(BIN)/python $$f > build/bench/last.out || failed="$$failed $$f"; \
		cat build/bench/last.out; cat build/bench/last.out >> build/bench/results.jsonl; \
	done; \
	$(BIN)/python tests/bench/plot.py build/bench/results.jsonl build/bench/performance.png \
		|| failed="$$failed plot.py"; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed" >&2; exit 1; fi

# Long runs kept out of CI (the fault soaks, the fleet's network faults, the demo, the mirror
# with real agents, the Spark standalone cluster, three secured brokers); -s shows each run's
# figures and JSON lines. Two groups side by side (tests/run_groups.py --soak): the broker-pause
# matrix, and the rest at the lowest CPU priority; PYTEST_ARGS naming tests run one session.
soak: setup
	$(BIN)/python tests/run_groups.py --soak $(PYTEST_ARGS)

# The whole pipeline on this machine (demo/), in LinkedIn's topology: three hosts each with an
# application writing rotated logs and its agent, writing to a local Kafka; MirrorMaker 2 copying
# the data and the audit topic to an aggregate Kafka; a Spark count job on each cluster and the
# land job from the aggregate; the reconciler reading the aggregate, the dashboard and an alert
# receiver, with a live line per part; Ctrl-C or demo-down stops it all, the mirror and both
# clusters included. demo-fault runs the fault drills against it (--only DRILL, repeatable; the
# mirror drill stops the mirror). DEMO_ARGS: e.g. --dir DIR --base-port PORT (the demo takes
# PORT to PORT+17).
DEMO_ARGS ?=
demo: setup
	$(BIN)/python -m demo up $(DEMO_ARGS)

demo-down:
	$(BIN)/python -m demo down $(DEMO_ARGS)

demo-fault:
	$(BIN)/python -m demo fault $(DEMO_ARGS)

# The dashboard's pages as the browser test sees them, into docs/screenshots (the README's).
screenshots: setup
	DOCKET_SCREENSHOTS=docs/screenshots $(BIN)/pytest -q tests/integration/test_dashboard_browser.py

# The Debian packages docket-agent and docket-audit (packaging/debian, dh-virtualenv), built
# from the checkout's files (tracked, or new and not ignored) and the native send path's wheel
# (make setup builds it) into dist/.
deb: setup
	@ls $(NATIVE_WHEELS)/docket_native-*.whl >/dev/null 2>&1 || { echo "make deb: the native" \
		"send path is not built (make native says why); the package ships it" >&2; exit 1; }
	rm -rf build/deb && mkdir -p build/deb/src dist
	git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - | tar -xf - -C build/deb/src
	cp -r packaging/debian build/deb/src/debian
	cp -r $(NATIVE_WHEELS) build/deb/src/native-wheel
	mkdir -p build/deb/src/kafka-client && cp $(KAFKA_CLIENT)/confluent_kafka-*.whl build/deb/src/kafka-client/
	cd build/deb/src && dpkg-buildpackage -us -uc -b
	mv build/deb/*.deb dist/
	@ls -l dist/*.deb

# Build both packages, install them, check them, purge them (as root; a few minutes).
test-packages: setup
	$(BIN)/pytest -m packages -s tests/integration/test_packages.py $(PYTEST_ARGS)

# The wheel and the sdist (python -m build) into dist/.
dist: setup
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist
