"""The platform's JVM classes (include/deploy/java, a Maven module): ``./platform setup`` and the
image build their jar with one Maven command, against the jars pyspark ships, and the jar holds
every class that the sessions are configured with. Checked without a container engine."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from spark_jobs.runtime import session

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "include" / "deploy" / "java"
POM = ET.parse(MODULE / "pom.xml").getroot()
NS = {"m": "http://maven.apache.org/POM/4.0.0"}
MAIN_SOURCES = MODULE / "src" / "main" / "java"


def joined(text: str) -> str:
    """Shell (and Dockerfile) text with its continued lines joined."""
    return re.sub(r"\\\n\s*", " ", text)


def module_builds(text: str) -> list[str]:
    """Every Maven command line in ``text`` that builds the module, its words single-spaced."""
    return [" ".join(m.split()) for m in re.findall(r"\bmvn [^\n;&|>]*include/deploy/java/pom\.xml[^\n;&|>]*",
                                                    joined(text))]


def shell_function(script: str, name: str) -> str:
    return re.search(rf"^{name}\(\) \{{\n(.*?)^\}}", script, re.M | re.S).group(1)


def dockerfile_runs() -> list[str]:
    return [line[4:] for line in joined((ROOT / "Dockerfile").read_text()).splitlines() if line.startswith("RUN ")]


def pom_property(name: str) -> str:
    return POM.find(f"m:properties/m:{name}", NS).text


def interpolated(text: str) -> str:
    """``text`` with the pom's ``${...}`` properties in it replaced (``project.basedir``: the module's folder)."""
    return re.sub(r"\$\{([\w.]+)\}", lambda m: str(MODULE) if m[1] == "project.basedir" else pom_property(m[1]),
                  text)


def test_the_image_builds_the_jar_with_the_same_maven_command_as_setup() -> None:
    setup = shell_function((ROOT / "platform").read_text(), "build_local_fs")
    built = module_builds(setup)
    assert len(built) == 1, built
    assert built[0].startswith("mvn -q -B -f include/deploy/java/pom.xml ") and "-DskipTests" in built[0].split()
    assert built[0].split()[-1] == "package"
    runs = [run for run in dockerfile_runs() if module_builds(run)]
    assert len(runs) == 1 and module_builds(runs[0]) == built
    # the jar Maven makes, where the sessions look for it (the image's WORKDIR is the project's root)
    jar = f"include/deploy/java/target/{POM.find('m:build/m:finalName', NS).text}.jar"
    destination = session.LOCAL_FS_JAR.relative_to(ROOT).as_posix()
    assert f"cp {jar} {destination}" in runs[0]
    assert 'cp "$JVM_MODULE/target/local-fs.jar" "$dest/local-fs.jar"' in setup and jar.endswith("/local-fs.jar")
    assert '"$ROOT/.jars/local-fs"' in setup and destination == ".jars/local-fs/local-fs.jar"
    # from the module as it is in the repository, with Maven's cache gone from the layer
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.index("COPY --chown=airflow:0 include/deploy/java include/deploy/java") < dockerfile.index(
        built[0].split(" -f ")[0] + " -f include/deploy/java/pom.xml")
    assert 'rm -rf include/deploy/java/target "$HOME/.m2"' in runs[0]
    assert not re.search(r"\bjavac -", dockerfile + setup)  # one build: Maven's


def test_setup_and_the_image_make_the_drivers_class_archive_after_the_jar_and_the_code() -> None:
    """The archive is keyed on the platform's jar and made by a run of the stream job: both must be
    there first, in setup and in the image alike."""
    command = "python -m spark_jobs.runtime.class_archive"
    script = (ROOT / "platform").read_text()
    setup = shell_function(script, "setup")
    assert setup.index("build_local_fs") < setup.index("build_class_archive")
    assert command in shell_function(script, "build_class_archive")
    runs = dockerfile_runs()
    made = [i for i, run in enumerate(runs) if run.strip() == command]
    jar = [i for i, run in enumerate(runs) if module_builds(run)]
    assert len(made) == 1 and jar and jar[0] < made[0]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.index("COPY --chown=airflow:0 spark_jobs spark_jobs") < dockerfile.index(f"RUN {command}")


def test_the_module_compiles_against_the_jars_pyspark_ships() -> None:
    """Every dependency is one of pyspark's jars, at its version (``provided``: Spark brings it),
    so that the classes run on the Spark they were compiled against; JUnit's alone are the tests'."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    dependencies = POM.findall("m:dependencies/m:dependency", NS)
    provided = [d for d in dependencies if d.findtext("m:scope", namespaces=NS) == "provided"]
    assert {d.findtext("m:scope", namespaces=NS) for d in dependencies} == {"provided", "test"}
    assert {d.findtext("m:groupId", namespaces=NS) for d in dependencies if d not in provided} == {"org.junit.jupiter"}
    for dependency in provided:
        name = f"{dependency.findtext('m:artifactId', namespaces=NS)}-{interpolated(dependency.findtext('m:version', namespaces=NS))}.jar"
        assert (jars / name).is_file(), f"pyspark ships no {name}"
    assert {"spark-sql_2.13", "hadoop-client-api", "jackson-databind"} <= {
        d.findtext("m:artifactId", namespaces=NS) for d in provided}
    # the fencing rule's table of cases, which the Python lease's tests run too
    cases = Path(interpolated(pom_property("lease.cases")))
    assert cases.resolve() == ROOT / "tests" / "spark_jobs" / "runtime" / "lease_cases.json"


def test_the_jar_holds_every_class_the_sessions_are_configured_with(monkeypatch, missing_system_package) -> None:
    if not session.LOCAL_FS_JAR.is_file():
        missing_system_package("a JDK and Maven, to build the platform's JVM classes (./platform setup)")
    monkeypatch.setenv("STREAMS_LOCAL_FS_JAR", str(session.LOCAL_FS_JAR))
    conf = session.local_fs_conf() | session.fenced_checkpoints_conf()
    configured = {value for value in conf.values() if re.fullmatch(r"(?:[a-z_]\w*\.)+[A-Z]\w*", value)}
    assert session.FENCED_CHECKPOINTS in configured and len(configured) == 3, conf
    with zipfile.ZipFile(session.LOCAL_FS_JAR) as jar:
        classes = {name for name in jar.namelist() if name.endswith(".class")}
    for name in configured:
        assert name.replace(".", "/") + ".class" in classes, f"{name} is configured, but not in the jar"
    compiled = {p.relative_to(MAIN_SOURCES).with_suffix(".class").as_posix() for p in MAIN_SOURCES.rglob("*.java")}
    assert compiled and compiled <= classes
    assert {re.sub(r"\$.*", ".class", name) for name in classes} == compiled, "a class from no source of the module"
