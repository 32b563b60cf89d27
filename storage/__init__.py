"""Where bytes live and how they are fetched: local directories and object storage, credentials, and a node's bounded chunk cache. Readers and writers both use it."""
