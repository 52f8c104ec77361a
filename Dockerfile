# One image for every service of the platform: the Airflow services (API server,
# scheduler, DAG processor, triggerer) and the Spark standalone master and workers.
# Built as Airflow's image docs recommend: extend the official image, keep Airflow's own
# version pinned while adding requirements, run as the non-root `airflow` user.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}

# Java for Spark (drivers run in the Airflow services, executors on the workers); a JDK and Maven,
# to fetch the connectors and build the platform's JVM classes below
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven procps curl \
 && apt-get autoremove -yqq --purge && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/default-java \
 && mkdir -p /opt/streams/data && chown -R airflow:0 /opt/streams
ENV JAVA_HOME=/usr/lib/jvm/default-java

USER airflow
WORKDIR /opt/streams
# the project's pinned stack first (a layer that changes only with pyproject.toml)...
COPY --chown=airflow:0 pyproject.toml README.md ./
# (every package folder the project lists must exist for the editable install)
RUN mkdir -p runner spark_jobs/stream_spec spark_jobs/runtime spark_jobs/sinks spark_jobs/sources spark_jobs/flows spark_jobs/quality runner/testdata \
             plugins/streamops/hooks plugins/streamops/operators plugins/streamops/sensors plugins/streamops/triggers \
             plugins/streamops/static plugins/streamops/templates spark_jobs/quality/templates \
 && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -e . && pip check
# Spark's Kafka connector and Delta Lake from Maven Central, baked in (every driver gets them through --jars; nothing
# is fetched at run time), as `./platform setup` fetches them
COPY --chown=airflow:0 include/deploy/maven/spark-connectors.xml include/deploy/maven/
RUN mvn -q -B -f include/deploy/maven/spark-connectors.xml dependency:copy-dependencies \
        -DoutputDirectory=/opt/streams/.jars/spark-connectors \
 && rm -rf "$HOME/.m2"
# the platform's JVM classes (include/deploy/java: its local file system, which every driver gets, a
# chmod or readlink process per file written otherwise; its fenced checkpoint manager), built with the
# same Maven command as ./platform setup's, against the Spark, Hadoop and Jackson of the pip-installed
# pyspark (`provided`: Maven fetches them to compile, then they go with its cache)
COPY --chown=airflow:0 include/deploy/java include/deploy/java
RUN mvn -q -B -f include/deploy/java/pom.xml -DskipTests clean package \
 && mkdir -p .jars/local-fs && cp include/deploy/java/target/local-fs.jar .jars/local-fs/local-fs.jar \
 && rm -rf include/deploy/java/target "$HOME/.m2"
# ...then the code: Spark jobs, DAGs, the Airflow plugin, specs, rules and reference data
COPY --chown=airflow:0 spark_jobs spark_jobs
COPY --chown=airflow:0 plugins plugins
COPY --chown=airflow:0 dags dags
COPY --chown=airflow:0 include include
# the drivers' class archive (spark_jobs/runtime/class_archive.py), as ./platform setup makes it: Spark's
# classes parsed and verified once here, mapped by every driver's JVM at its start
RUN python -m spark_jobs.runtime.class_archive

ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/streams/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/streams/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    STREAMS_DATA_DIR=/opt/streams/data \
    PYSPARK_PYTHON=python \
    TZ=UTC
