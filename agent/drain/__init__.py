"""Drain: sealed slots → Kafka, in sequence order; a slot is freed once every record in it is
acknowledged. ``outcome`` reduces every Kafka result to ok / retry / dead in one place;
``producer`` builds the client configuration; ``drain`` runs the sending and the outage guard."""
