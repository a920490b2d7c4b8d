# The one image of the compose stack's Airflow components, its one-shot data loader and its Spark
# master and worker: Spark runs from pyspark's own launcher (spark-class), so the executors have the
# same Python at the same path (spark.pyspark.python is the Airflow worker's interpreter), the same
# packages and the same Spark 4.3.0 as the driver.
FROM eclipse-temurin:17-jre AS java

# Python 3.11: requirements.txt is a freeze of a Python 3.11 environment.
FROM apache/airflow:3.3.2-python3.11
# Spark needs a JVM; copied in whole so the build doesn't depend on the base image's Debian release.
COPY --from=java /opt/java/openjdk /opt/java/openjdk
ENV JAVA_HOME=/opt/java/openjdk \
    PATH=/opt/java/openjdk/bin:$PATH
COPY requirements.txt /tmp/requirements.txt
# pyspark-client (pulled in by the Spark provider) overwrites parts of pyspark: reinstall it on top,
# as the Makefile does, so spark-submit and spark-class work.
RUN pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps --force-reinstall pyspark==4.3.0
