"""Request and response models, one module per resource: XCreate / XUpdate / XPublic, and
the functions that turn a stored row into its public form. `inputs` holds what every
request shares (unknown fields refused, text and JSON that PostgreSQL can store); `pages`
the cursor-paginated list.

Requests forbid unknown fields, so a typo is a 422 naming the field, not a silent default.
"""
