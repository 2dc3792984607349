"""The compatibility run (`scripts/compat`): software Biplane did not write — Apache Kafka's own
command-line tools and the franz-go client — against a local cluster's Kafka API."""
