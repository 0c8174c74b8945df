"""tidelog.console: the web console, a separate process built on tidelog.client.

It speaks only standard Kafka APIs through the client, so it shows any Kafka-compatible
cluster. :mod:`.app` holds the Starlette routes, :mod:`.model` gathers what the pages show,
:mod:`.scan` reads and searches partitions within bounds, :mod:`.render` turns bytes into
text, JSON or hex, :mod:`.forms` checks what is typed into the pages.
"""
