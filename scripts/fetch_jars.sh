#!/usr/bin/env bash
# Fetch the Spark jars the product needs beyond the pyspark wheel's (the S3A connector and Spark's
# cloud committers, scripts/spark-jars/pom.xml) by their Maven coordinates, with versions matched
# to the installed pyspark (its Spark version and the Hadoop client inside it), and cache them in
# $DEDUP_SPARK_JARS_CACHE (default ~/.cache/dedup_pipeline/spark-jars) under a directory named for
# those versions: a second run finds them and does nothing. Jars the pyspark wheel already ships
# (same artifact name) are not copied, so the wheel's versions are the ones on the classpath.
# Needs Maven (`mvn`, Maven Central reachable); the session builder reads the cache
# (engine/session.py). Prints the cache directory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
read -r spark hadoop pyjars < <("$PY" - <<'PYEOF'
import glob, os, re, pyspark
jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
core = glob.glob(os.path.join(jars, "spark-core_*.jar"))[0]
spark = re.search(r"spark-core_[\d.]+-(.+)\.jar", core).group(1)
api = glob.glob(os.path.join(jars, "hadoop-client-api-*.jar"))[0]
hadoop = re.search(r"hadoop-client-api-(.+)\.jar", api).group(1)
print(spark, hadoop, jars)
PYEOF
)
cache="${DEDUP_SPARK_JARS_CACHE:-$HOME/.cache/dedup_pipeline/spark-jars}/spark-$spark-hadoop-$hadoop"
if [ -f "$cache/.complete" ]; then
  echo "$cache"
  exit 0
fi
command -v mvn >/dev/null 2>&1 || {
  echo "fetch_jars: Maven (mvn) is needed to fetch the S3A connector jars (apt-get install maven)" >&2
  exit 1
}
echo "fetch_jars: fetching hadoop-aws $hadoop, the AWS SDK v2 modules and spark-hadoop-cloud $spark into $cache" >&2
pom=scripts/spark-jars/pom.xml
# the SDK version S3A was built against: hadoop-project's aws-java-sdk-v2.version
tmp="$cache.tmp-$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
mvn -B -q dependency:copy -Dartifact="org.apache.hadoop:hadoop-project:$hadoop:pom" \
    -DoutputDirectory="$tmp" >&2
sdk=$(sed -n 's:.*<aws-java-sdk-v2.version>\(.*\)</aws-java-sdk-v2.version>.*:\1:p' \
      "$tmp/hadoop-project-$hadoop.pom" | head -n1)
rm -f "$tmp/hadoop-project-$hadoop.pom"
[ -n "$sdk" ] || { echo "fetch_jars: no AWS SDK version in hadoop-project $hadoop's pom" >&2; exit 1; }
# spark-hadoop-cloud is not published for every Spark release (none for 4.2.x and 4.3.0 on
# 2026-12-02): the installed Spark's own, else the newest earlier 4.x one that is (its committer
# classes use Spark's stable FileCommitProtocol API; the S3 tier's loads are the check)
cloud=""
for v in "$spark" 4.2.1 4.2.0 4.1.2 4.1.1 4.1.0; do
  if mvn -B -q dependency:get -Dartifact="org.apache.spark:spark-hadoop-cloud_2.13:$v" \
       -Dtransitive=false >/dev/null 2>&1; then
    cloud=$v; break
  fi
done
[ -n "$cloud" ] || { echo "fetch_jars: no spark-hadoop-cloud_2.13 release for Spark $spark found" >&2; exit 1; }
[ "$cloud" = "$spark" ] || echo "fetch_jars: spark-hadoop-cloud $cloud (none published for Spark $spark)" >&2
mvn -B -q -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
    -Dhadoop.version="$hadoop" -Dcloud.version="$cloud" -Dawssdk.version="$sdk" >&2
# drop what the pyspark wheel already ships (same artifact, any version)
for j in "$tmp"/*.jar; do
  base=$(basename "$j" .jar)
  artifact=$(echo "$base" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)*$//')
  if compgen -G "$pyjars/$artifact-[0-9]*.jar" >/dev/null; then
    rm -f "$j"
  fi
done
touch "$tmp/.complete"
rm -rf "$cache"
mv "$tmp" "$cache"
echo "fetch_jars: $(ls "$cache"/*.jar | wc -l) jars, $(du -sh "$cache" | cut -f1)" >&2
echo "$cache"
