"""The learner's loss, filters, feed, sharding, settings and publishing, without a server."""
