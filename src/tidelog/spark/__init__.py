"""tidelog.spark"""
