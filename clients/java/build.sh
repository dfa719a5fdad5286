#!/usr/bin/env bash
# Builds the Java client with the JDK alone (javac, jar; no Maven, no network):
#
#   clients/java/build.sh              # build/tumbler-client.jar (the library) and build/tumbler-conformance.jar
#   clients/java/build.sh test         # then the JUnit 5 tests (Debian's junit5), one JVM, against real servers
#
# JDK 17 or later (Debian: openjdk-17-jdk-headless). The library needs nothing else at run time; the tests need
# Debian's junit5 (installed here when missing, with apt-get), redis-server, and the tumbler binary ($TUMBLER_BIN,
# else ../../target/debug/tumbler). OUT=dir puts the build elsewhere (default: clients/java/build).
set -euo pipefail
cd "$(dirname "$0")"
out=${OUT:-$PWD/build}
rm -rf "$out/classes" "$out/conformance-classes" "$out/test-classes"
mkdir -p "$out/classes" "$out/conformance-classes"
javac -d "$out/classes" --release 17 -Xlint:all -Werror $(find src/main/java -name '*.java')
jar --create --file "$out/tumbler-client.jar" -C "$out/classes" .
javac -d "$out/conformance-classes" --release 17 -cp "$out/tumbler-client.jar" conformance/*.java
jar --create --file "$out/tumbler-conformance.jar" -C "$out/conformance-classes" .
echo "built $out/tumbler-client.jar ($(stat -c %s "$out/tumbler-client.jar") bytes) and $out/tumbler-conformance.jar"

[ "${1:-}" = test ] || exit 0
launcher=/usr/share/java/junit-platform-console-standalone.jar
if [ ! -f "$launcher" ]; then
  need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 junit5 >/dev/null
fi
mkdir -p "$out/test-classes"
javac -d "$out/test-classes" --release 17 -cp "$out/tumbler-client.jar:$launcher" $(find src/test/java -name '*.java')
exec java -XX:+UseSerialGC -cp "$out/tumbler-client.jar:$out/test-classes" -jar "$launcher" \
  --class-path "$out/tumbler-client.jar:$out/test-classes" --scan-class-path --disable-banner --disable-ansi-colors --details=tree \
  --details-theme=ascii
