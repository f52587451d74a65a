//! Every redb table mesh keeps, the numbered migrations that create and change them, and the runner that applies them at open.
