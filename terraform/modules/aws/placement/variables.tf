variable "cluster_name" {
  description = "kit cluster name; names the placement group."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "cluster_name: a lowercase letter, then up to 30 lowercase letters, digits or '-'."
  }
}

variable "availability_zone" {
  description = "The nodes' Availability Zone; names the placement group (a cluster group is confined to one)."
  type        = string
  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z0-9]+)+$", var.availability_zone))
    error_message = "availability_zone: an AWS Availability Zone name, e.g. us-east-1a."
  }
}

variable "enabled" {
  description = "Create a cluster placement group (spec placement: cluster)."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags for every resource (kit:cluster etc.)."
  type        = map(string)
  default     = {}
}
