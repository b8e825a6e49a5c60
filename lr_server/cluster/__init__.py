"""The site's cluster: members, placement of units, upkeep and retention on a schedule,
and which streams the site ships."""
